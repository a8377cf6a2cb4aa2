"""Who may come in and what they may do: bearer tokens and roles (``auth``), the password-login lockout
(``lockout``), rate limits (``throttling``), the API's permission (``permissions``), who a request comes
from (``clients``), the refused accesses the audit log records (``refusals``), and the users and tokens
themselves (``services``, ``selectors``)."""
