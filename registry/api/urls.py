from django.urls import path

from registry.api import views

urlpatterns = [
    path("models", views.ModelListCreate.as_view(), name="model-list"),
    path("models/<str:name>", views.ModelDetail.as_view(), name="model-detail"),
    path("models/<str:name>/versions", views.VersionListUpload.as_view(), name="version-list"),
    path("models/<str:name>/versions/<int:version>", views.VersionDetail.as_view(), name="version-detail"),
    path("models/<str:name>/versions/<int:version>/download", views.VersionDownload.as_view(), name="version-download"),
]
