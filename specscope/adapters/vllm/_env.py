"""The environment variables that switch the plugin on and shape its run (the package doc says what
each does); apart from the package, so its parts read them without importing the entry point."""

ENV_DB = "SPECSCOPE_DB"
ENV_RUN_ID = "SPECSCOPE_RUN_ID"
ENV_PROVENANCE_EVERY = "SPECSCOPE_PROVENANCE_EVERY"
ENV_LABEL = "SPECSCOPE_LABEL"
ENV_AUDIT_EVERY = "SPECSCOPE_AUDIT_EVERY"
ENV_TOKEN_REQUESTS = "SPECSCOPE_TOKEN_REQUESTS"
