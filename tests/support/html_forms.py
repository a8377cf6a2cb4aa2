"""The forms of a rendered page, and what a browser sends when one is submitted with only what it must hold.

Read with the standard library's HTML parser: each ``<form method="post">`` with its controls (those
inside it and those outside that name it with ``form="id"``), and one submission per submit button
(a button's ``formaction`` sends the form elsewhere). ``browser_fields`` is the form data set a
browser builds (the HTML standard's "constructing the entry list"): hidden fields as rendered, the
clicked button's name and value, a select's selected option, checkboxes only when ticked, and every
text control, here filled only where the caller says and otherwise present and empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin

TEXT_TAGS = ("input", "textarea", "select", "button")
BUTTON_TYPES = ("submit", "image")
NOT_SENT = ("reset", "button")


@dataclass
class Control:
    tag: str
    type: str
    name: str
    value: str
    required: bool = False
    checked: bool = False
    disabled: bool = False
    formaction: str | None = None
    options: list[tuple[str, bool]] = field(default_factory=list)  # a select's (value, selected)

    @property
    def is_button(self) -> bool:
        return (self.tag == "button" and self.type in BUTTON_TYPES) or (
            self.tag == "input" and self.type in BUTTON_TYPES
        )


@dataclass
class Form:
    """One ``<form>`` as rendered: its address (absolute path), encoding and controls."""

    action: str
    enctype: str
    id: str
    classes: set[str]
    controls: list[Control] = field(default_factory=list)

    @property
    def buttons(self) -> list[Control]:
        return [control for control in self.controls if control.is_button and not control.disabled]

    def targets(self) -> list[tuple[str, Control | None]]:
        """(where it posts, with which button): one per submit button, or the form's own action without one."""
        if not self.buttons:
            return [(self.action, None)]
        return [(button.formaction or self.action, button) for button in self.buttons]


class _Parser(HTMLParser):
    def __init__(self, page: str, method: str) -> None:
        super().__init__(convert_charrefs=True)
        self.page = page
        self.method = method
        self.forms: list[Form] = []
        self.by_id: dict[str, Form] = {}
        self.orphans: list[tuple[str, Control]] = []  # controls outside a form that name one
        self.current: Form | None = None
        self.open: Control | None = None  # a textarea or select being read, or a button's text
        self.text: list[str] = []

    def _absolute(self, address: str | None) -> str:
        return urljoin(self.page, address or self.page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {key: (value if value is not None else "") for key, value in attrs}
        if tag == "form":
            if a.get("method", "get").lower() != self.method:
                return
            self.current = Form(
                action=self._absolute(a.get("action")),
                enctype=a.get("enctype", "application/x-www-form-urlencoded").lower(),
                id=a.get("id", ""),
                classes=set(a.get("class", "").split()),
            )
            self.forms.append(self.current)
            if self.current.id:
                self.by_id[self.current.id] = self.current
            return
        if tag == "option" and self.open is not None and self.open.tag == "select":
            self.open.options.append((a.get("value", ""), "selected" in a))
            return
        if tag not in TEXT_TAGS:
            return
        default_type = {"input": "text", "button": "submit", "textarea": "textarea", "select": "select"}[tag]
        control = Control(
            tag=tag,
            type=a.get("type", default_type).lower(),
            name=a.get("name", ""),
            value=a.get("value", ""),
            required="required" in a,
            checked="checked" in a,
            disabled="disabled" in a,
            formaction=self._absolute(a["formaction"]) if "formaction" in a else None,
        )
        if "form" in a:
            self.orphans.append((a["form"], control))
        elif self.current is not None:
            self.current.controls.append(control)
        if tag in ("textarea", "select"):
            self.open, self.text = control, []

    def handle_data(self, data: str) -> None:
        if self.open is not None and self.open.tag == "textarea":
            self.text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.current = None
        elif tag == "textarea" and self.open is not None:
            self.open.value = "".join(self.text).removeprefix("\n")  # the newline after <textarea> is not content
            self.open = None
        elif tag == "select" and self.open is not None:
            options = self.open.options
            chosen = next((value for value, selected in options if selected), options[0][0] if options else "")
            self.open.value = chosen
            self.open = None


def post_forms(html: str, page: str, *, method: str = "post") -> list[Form]:
    """Every ``<form method="post">`` (or of another ``method``) of ``html``, rendered at the path ``page``."""
    parser = _Parser(page, method)
    parser.feed(html)
    parser.close()
    for form_id, control in parser.orphans:
        if form_id in parser.by_id:
            parser.by_id[form_id].controls.append(control)
    return parser.forms


def browser_fields(form: Form, button: Control | None, fill: dict[str, Any]) -> list[tuple[str, Any]]:
    """The (name, value) pairs a browser sends when ``button`` submits ``form`` and the user filled only ``fill``.

    Text controls not in ``fill`` are sent empty; a ``required`` one must be in ``fill``. Checkboxes and
    radio buttons are sent only when ``fill`` ticks them (True) or gives their value. A file control takes
    a list of (file name, bytes) from ``fill``.
    """
    pairs: list[tuple[str, Any]] = []
    for control in form.controls:
        if not control.name or control.disabled or control.type in NOT_SENT:
            continue
        if control.is_button:
            if control is button:
                pairs.append((control.name, control.value))
            continue
        if control.type == "hidden":
            pairs.append((control.name, control.value))
        elif control.type in ("checkbox", "radio"):
            wanted = fill.get(control.name)
            ticked = wanted is True or wanted == control.value or (isinstance(wanted, list) and control.value in wanted)
            assert ticked or not control.required, f"fill must tick the required {control.type} {control.name!r}"
            if ticked:
                pairs.append((control.name, control.value or "on"))
        elif control.tag == "select":
            pairs.append((control.name, fill.get(control.name, control.value)))
        elif control.type == "file":
            for name, data in fill.get(control.name, []):
                pairs.append((control.name, (name, data)))
        else:
            assert control.name in fill or not control.required, f"fill must give the required {control.name!r}"
            pairs.append((control.name, fill.get(control.name, "")))
    unknown = set(fill) - {control.name for control in form.controls}
    assert not unknown, f"the form has no control named {sorted(unknown)}"
    return pairs
