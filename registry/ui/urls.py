from django.urls import path

from registry.ui import account_views as ui_account_views
from registry.ui import job_views as ui_job_views
from registry.ui import lifecycle_views as ui_lifecycle_views
from registry.ui import lineage_views as ui_lineage_views
from registry.ui import views as ui_views

app_name = "ui"

# Other tools link to these addresses: keep them.
urlpatterns = [
    path("", ui_views.model_index, name="models"),
    path("models/<str:name>", ui_views.model_detail, name="model"),
    path("models/<str:name>/upload", ui_views.version_upload_page, name="upload"),
    path("models/<str:name>/batching", ui_views.model_batching, name="model-batching"),
    path("models/<str:name>/versions/<int:number>", ui_views.version_detail, name="version"),
    path("models/<str:name>/versions/<int:number>/card", ui_lineage_views.version_card_page, name="version-card"),
    path("models/<str:name>/delete", ui_lifecycle_views.model_delete, name="model-delete"),
    path("models/<str:name>/retention", ui_lifecycle_views.model_retention, name="model-retention"),
    path(
        "models/<str:name>/retention/preview",
        ui_lifecycle_views.model_retention_preview,
        name="model-retention-preview",
    ),
    path("models/<str:name>/versions/<int:number>/archive", ui_lifecycle_views.version_archive, name="version-archive"),
    path(
        "models/<str:name>/versions/<int:number>/unarchive",
        ui_lifecycle_views.version_unarchive,
        name="version-unarchive",
    ),
    path("models/<str:name>/versions/<int:number>/hold", ui_lifecycle_views.version_hold, name="version-hold"),
    path(
        "models/<str:name>/versions/<int:number>/hold/release",
        ui_lifecycle_views.version_release,
        name="version-release",
    ),
    path("models/<str:name>/versions/<int:number>/delete", ui_lifecycle_views.version_delete, name="version-delete"),
    path("models/<str:name>/compare", ui_views.version_compare, name="compare"),
    path("models/<str:name>/promote", ui_views.promotion_request, name="promote"),
    path("models/<str:name>/aliases/<str:alias>/rollback", ui_views.alias_rollback, name="alias-rollback"),
    path("models/<str:name>/aliases/<str:alias>/signature", ui_views.alias_signature, name="alias-signature"),
    path("models/<str:name>/aliases/<str:alias>/cache", ui_views.alias_cache, name="alias-cache"),
    path("models/<str:name>/aliases/<str:alias>/shadow", ui_views.alias_shadow_start, name="alias-shadow"),
    path("models/<str:name>/aliases/<str:alias>/shadow/stop", ui_views.alias_shadow_stop, name="alias-shadow-stop"),
    path("models/<str:name>/aliases/<str:alias>/rollout", ui_views.alias_rollout_start, name="alias-rollout"),
    path(
        "models/<str:name>/aliases/<str:alias>/rollout/pause", ui_views.alias_rollout_pause, name="alias-rollout-pause"
    ),
    path(
        "models/<str:name>/aliases/<str:alias>/rollout/resume",
        ui_views.alias_rollout_resume,
        name="alias-rollout-resume",
    ),
    path(
        "models/<str:name>/aliases/<str:alias>/rollout/abort", ui_views.alias_rollout_abort, name="alias-rollout-abort"
    ),
    path("promotions", ui_views.promotion_index, name="promotions"),
    path("promotions/<int:promotion_id>", ui_views.promotion_detail, name="promotion"),
    path("promotions/<int:promotion_id>/<str:decision>", ui_views.promotion_decide, name="promotion-decide"),
    path("jobs", ui_job_views.job_index, name="jobs"),
    path("jobs/new", ui_job_views.job_submit, name="job-new"),
    path("jobs/<str:job_id>", ui_job_views.job_detail, name="job"),
    path("jobs/<str:job_id>/cancel", ui_job_views.job_cancel, name="job-cancel"),
    path("audit", ui_views.audit_index, name="audit"),
    path("fleet", ui_views.fleet_index, name="fleet"),
    path("tokens", ui_account_views.token_index, name="tokens"),
    path("tokens/<str:prefix>/revoke", ui_account_views.token_revoke, name="token-revoke"),
    path("tokens/<str:prefix>/rotate", ui_account_views.token_rotate, name="token-rotate"),
    path("users", ui_account_views.user_index, name="users"),
    path("users/<str:username>", ui_account_views.user_access, name="user"),
    path("users/<str:username>/password-link", ui_account_views.user_password_link, name="user-password-link"),
]
