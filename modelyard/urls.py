from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import LogoutView
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from registry.access.lockout import LockoutAdminAuthenticationForm, LockoutAuthenticationForm
from registry.api import schema  # noqa: F401 - registers the bearer token's OpenAPI description with the views'
from registry.ui.account_views import PasswordChange, PasswordSet
from registry.ui.oidc_views import SignInView, oidc_callback, oidc_login
from registry.ui.views import home

# Both password logins refuse locked-out usernames and addresses (registry.access.lockout).
admin.site.login_form = LockoutAdminAuthenticationForm

# HTML pages under /ui/ and /accounts/, JSON everywhere else (registry.ui.errors).
handler403 = "registry.ui.errors.permission_denied"
handler404 = "registry.ui.errors.not_found"
handler500 = "registry.ui.errors.server_error"

# Only the account pages the UI uses. Django's emailed password reset is left out: Modelyard sends no mail,
# and an admin hands over a set-password link instead (/ui/users).
accounts = [
    path("login/", SignInView.as_view(authentication_form=LockoutAuthenticationForm), name="login"),
    path("oidc/login/", oidc_login, name="oidc_login"),
    path("oidc/callback/", oidc_callback, name="oidc_callback"),
    path("logout/", LogoutView.as_view(), name="logout"),
    path("password_change/", PasswordChange.as_view(), name="password_change"),
    path("reset/<uidb64>/<token>/", PasswordSet.as_view(), name="password_reset_confirm"),
]

urlpatterns = [
    path("", home, name="home"),
    path("ui/", include("registry.ui.urls")),
    path("accounts/", include(accounts)),
    path("api/v1/", include("registry.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("admin/", admin.site.urls),
]
# With password sign-in turned off (MODELYARD_PASSWORD_LOGIN=false) the admin's login is the login page, which
# offers the provider and refuses the password form.
if not settings.PASSWORD_LOGIN:
    urlpatterns.insert(0, path("admin/login/", SignInView.as_view(authentication_form=LockoutAuthenticationForm)))
