from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from registry.views import home

handler404 = "registry.api.errors.json_404"
handler500 = "registry.api.errors.json_500"

urlpatterns = [
    path("", home, name="home"),
    path("ui/", include("registry.ui_urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("registry.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("admin/", admin.site.urls),
]
