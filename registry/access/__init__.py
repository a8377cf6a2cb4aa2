"""Who may come in and what they may do: bearer tokens and roles (``auth``), what a token reaches (``scopes``:
its roles within its user's, its model patterns), the password-login lockout
(``lockout``), rate limits (``throttling``), the API's permission (``permissions``), who a request comes
from (``clients``), the refused accesses the audit log records (``refusals``), and the users, service accounts
and tokens themselves (``services``, ``selectors``)."""
