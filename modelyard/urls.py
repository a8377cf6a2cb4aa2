from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from registry.lockout import LockoutAdminAuthenticationForm, LockoutAuthenticationForm
from registry.views import home

# Both password logins refuse locked-out usernames and addresses (registry.lockout).
admin.site.login_form = LockoutAdminAuthenticationForm

handler404 = "registry.api.errors.json_404"
handler500 = "registry.api.errors.json_500"

urlpatterns = [
    path("", home, name="home"),
    path("ui/", include("registry.ui_urls")),
    path("accounts/login/", LoginView.as_view(authentication_form=LockoutAuthenticationForm), name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("registry.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("admin/", admin.site.urls),
]
