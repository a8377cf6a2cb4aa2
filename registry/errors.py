"""API errors with the status that says what went wrong; rendered as ``{"error", "detail"}``."""

from __future__ import annotations

from rest_framework import status
from rest_framework.exceptions import APIException


class ApiError(APIException):
    status_code: int = status.HTTP_400_BAD_REQUEST
    default_detail = "bad request"

    def __init__(self, message: str, detail: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.extra = detail


class UploadRejected(ApiError):
    status_code = status.HTTP_400_BAD_REQUEST


class PayloadTooLarge(ApiError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE


class Conflict(ApiError):
    status_code = status.HTTP_409_CONFLICT


class StorageDown(ApiError):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE


class Forbidden(ApiError):
    status_code = status.HTTP_403_FORBIDDEN


class NotFound(ApiError):
    status_code = status.HTTP_404_NOT_FOUND
