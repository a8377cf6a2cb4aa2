from django.urls import path

from registry.api import audit_views

urlpatterns = [
    path("audit", audit_views.AuditList.as_view(), name="audit-list"),
    path("audit/export", audit_views.AuditExport.as_view(), name="audit-export"),
    path("audit/verify", audit_views.AuditVerify.as_view(), name="audit-verify"),
]
