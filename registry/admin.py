"""The Django admin's user pages, with every change to someone's access written to the audit chain.

Django's own UserAdmin edits roles (groups), is_active, is_staff, is_superuser, permissions and
passwords without a trace in the audit log. Here each save first locks the user and reads its
access (``services.user_access_snapshot``), lets Django's form write, then appends one event per
difference (``services.user_access_record``), all inside the admin's transaction: a change and its
events commit or roll back together.

Groups are the roles. Renaming or deleting one would change every member's role at once, with
no event naming them, so the admin shows groups read-only; a migration creates the role groups,
so that the user page can grant each of them.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse

from registry.access import services
from registry.access.clients import actor_from_request

User = get_user_model()


def _checked_username(form: Any, username: str) -> str:
    """A name the form has already checked, refused here too when its letters mix scripts (a Cyrillic a in ada)."""
    refusal = services.username_script_refusal(username) if username else None
    if refusal is not None:
        raise ValidationError(refusal, code="mixed_scripts")
    if username and "username" in form.changed_data and form.instance.pk is not None:
        taken = User.objects.filter(username__iexact=username).exclude(pk=form.instance.pk).first()
        if taken is not None:
            raise ValidationError(f"'{username}' differs from the existing user '{taken.get_username()}' only in case")
    return username


class UserAddForm(AdminUserCreationForm):
    def clean_username(self) -> str:
        return _checked_username(self, super().clean_username() or "")


class UserEditForm(UserChangeForm):
    def clean_username(self) -> str:
        return _checked_username(self, self.cleaned_data.get("username") or "")


class AuditedUserAdmin(UserAdmin):
    # The same names the users page accepts: no look-alikes of another user's.
    add_form = UserAddForm
    form = UserEditForm

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        # Read before Django writes anything; save_related records once the groups are saved too.
        form.modelyard_access_before = services.user_access_snapshot(user_id=obj.pk) if change else None
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        services.user_access_record(
            user_id=form.instance.pk, before=form.modelyard_access_before, actor=actor_from_request(request)
        )

    def user_change_password(self, request: HttpRequest, id: str, form_url: str = "") -> HttpResponse:
        user = self.get_object(request, unquote(id)) if request.method == "POST" else None
        if user is None:  # showing the form, or a 404
            return super().user_change_password(request, id, form_url)
        with transaction.atomic():
            before = services.user_access_snapshot(user_id=user.pk)
            response = super().user_change_password(request, id, form_url)
            services.user_access_record(user_id=user.pk, before=before, actor=actor_from_request(request))
        return response

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        before = services.user_access_snapshot(user_id=obj.pk)  # delete_view runs in a transaction
        super().delete_model(request, obj)
        services.user_access_record(user_id=obj.pk, before=before, actor=actor_from_request(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        actor = actor_from_request(request)
        with transaction.atomic():
            before = {pk: services.user_access_snapshot(user_id=pk) for pk in queryset.values_list("pk", flat=True)}
            super().delete_queryset(request, queryset)
            for pk, access in before.items():
                services.user_access_record(user_id=pk, before=access, actor=actor)


class ReadOnlyGroupAdmin(GroupAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


admin.site.unregister(User)
admin.site.register(User, AuditedUserAdmin)
admin.site.unregister(Group)
admin.site.register(Group, ReadOnlyGroupAdmin)
