"""The error shape moved to `tokenmill.entrypoints.server.errors` (the whole server answers in it); these
names stay importable from here."""

from tokenmill.entrypoints.server.errors import (APIError, bad_request, error_body, error_response,
                                                  install_error_handlers, validation_message)

__all__ = ["APIError", "bad_request", "error_body", "error_response", "install_error_handlers",
           "validation_message"]
