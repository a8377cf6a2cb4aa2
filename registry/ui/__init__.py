"""The web UI: the pages (``views``; tokens, users and passwords in ``account_views``), their forms
(``forms``), traffic charts (``charts``), what every page knows of its viewer (``context``), the error
pages (``errors``) and the routes (``urls``). Templates are in ``templates/modelyard/ui/``."""
