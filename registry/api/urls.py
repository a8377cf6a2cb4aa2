from django.urls import include, path

from registry.api import (
    alias_views,
    derive_views,
    fleet_views,
    policy_views,
    provenance_views,
    rollout_views,
    shadow_views,
    token_views,
    views,
    webhook_views,
)

urlpatterns = [
    path("models", views.ModelListCreate.as_view(), name="model-list"),
    path("models/<str:name>", views.ModelDetail.as_view(), name="model-detail"),
    path("models/<str:name>/versions", views.VersionListUpload.as_view(), name="version-list"),
    path("models/<str:name>/versions/<int:version>", views.VersionDetail.as_view(), name="version-detail"),
    path("models/<str:name>/versions/<int:version>/download", views.VersionDownload.as_view(), name="version-download"),
    path(
        "models/<str:name>/versions/<int:version>/provenance",
        provenance_views.VersionProvenance.as_view(),
        name="version-provenance",
    ),
    path(
        "models/<str:name>/versions/<int:version>/derive", derive_views.VersionDerive.as_view(), name="version-derive"
    ),
    path(
        "models/<str:name>/versions/<int:version>/benchmarks",
        derive_views.VersionBenchmarks.as_view(),
        name="version-benchmarks",
    ),
    path("derive-jobs/<int:pk>", derive_views.DeriveJobDetail.as_view(), name="derive-job-detail"),
    path("models/<str:name>/aliases", alias_views.AliasList.as_view(), name="alias-list"),
    path("models/<str:name>/aliases/<str:alias>", alias_views.AliasDetail.as_view(), name="alias-detail"),
    path("models/<str:name>/aliases/<str:alias>/rollback", alias_views.AliasRollback.as_view(), name="alias-rollback"),
    path("models/<str:name>/aliases/<str:alias>/history", alias_views.AliasHistory.as_view(), name="alias-history"),
    path("models/<str:name>/aliases/<str:alias>/shadow", shadow_views.AliasShadow.as_view(), name="alias-shadow"),
    path("models/<str:name>/aliases/<str:alias>/policy", policy_views.AliasPolicy.as_view(), name="alias-policy"),
    path(
        "models/<str:name>/aliases/<str:alias>/policy/evaluate",
        policy_views.AliasPolicyEvaluate.as_view(),
        name="alias-policy-evaluate",
    ),
    path("models/<str:name>/aliases/<str:alias>/rollout", rollout_views.AliasRollout.as_view(), name="alias-rollout"),
    path(
        "models/<str:name>/aliases/<str:alias>/rollout/pause",
        rollout_views.RolloutPause.as_view(),
        name="alias-rollout-pause",
    ),
    path(
        "models/<str:name>/aliases/<str:alias>/rollout/resume",
        rollout_views.RolloutResume.as_view(),
        name="alias-rollout-resume",
    ),
    path(
        "models/<str:name>/aliases/<str:alias>/rollout/abort",
        rollout_views.RolloutAbort.as_view(),
        name="alias-rollout-abort",
    ),
    path("fleet", fleet_views.FleetList.as_view(), name="fleet"),
    path("signing-keys", provenance_views.SigningKeys.as_view(), name="signing-keys"),
    path("promotions", alias_views.PromotionList.as_view(), name="promotion-list"),
    path("promotions/<int:pk>", alias_views.PromotionDetail.as_view(), name="promotion-detail"),
    path("promotions/<int:pk>/approve", alias_views.PromotionApprove.as_view(), name="promotion-approve"),
    path("promotions/<int:pk>/reject", alias_views.PromotionReject.as_view(), name="promotion-reject"),
    path("promotions/<int:pk>/cancel", alias_views.PromotionCancel.as_view(), name="promotion-cancel"),
    path("me", token_views.Me.as_view(), name="me"),
    path("tokens", token_views.TokenListCreate.as_view(), name="token-list"),
    path("tokens/<str:prefix>", token_views.TokenDetail.as_view(), name="token-detail"),
    path("webhooks", webhook_views.WebhookListCreate.as_view(), name="webhook-list"),
    path("webhooks/<int:pk>", webhook_views.WebhookDetail.as_view(), name="webhook-detail"),
    path("webhooks/<int:pk>/deliveries", webhook_views.DeliveryList.as_view(), name="webhook-deliveries"),
    path("", include("registry.api.audit_urls")),
]
