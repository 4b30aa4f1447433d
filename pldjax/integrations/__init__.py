"""Layer 6, integrations: pldjax inside other libraries.

``optax_transforms`` (``pj.optax``), ``dp_accounting_adapter`` (``pj.dp_accounting``) and
``opacus_accountant`` (``pj.opacus``). Each module is named for what it provides, never after
the package it wraps, and is imported on first use through ``pldjax._LAZY``. A new integration
is one module here plus one ``_LAZY`` entry.
"""
