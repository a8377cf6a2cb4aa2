from django.urls import path

from registry import ui_views

app_name = "ui"

urlpatterns = [
    path("", ui_views.model_index, name="models"),
    path("models/<str:name>", ui_views.model_detail, name="model"),
    path("models/<str:name>/aliases/<str:alias>/rollback", ui_views.alias_rollback, name="alias-rollback"),
    path("promotions", ui_views.promotion_index, name="promotions"),
    path("promotions/<int:promotion_id>/<str:decision>", ui_views.promotion_decide, name="promotion-decide"),
    path("audit", ui_views.audit_index, name="audit"),
    path("fleet", ui_views.fleet_index, name="fleet"),
]
