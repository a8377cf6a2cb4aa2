from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Model registry"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_login_failed

        from registry.access import lockout
        from registry.access.refusals import on_user_login_failed

        user_login_failed.connect(on_user_login_failed, dispatch_uid="registry.audit.login_failed")
        # After the audit receiver, so the log shows the failure before the lockout it causes.
        user_login_failed.connect(lockout.on_user_login_failed, dispatch_uid="registry.lockout.login_failed")
