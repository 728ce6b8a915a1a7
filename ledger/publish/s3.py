"""The S3 driver: tiles as objects under S3 Object Lock in compliance mode.

Each object is written with a compliance-mode retention of the log's retention period, so
not even the bucket's owner can overwrite or delete that version before it ends (the WORM
storage SEC 17a-4(f) accepts). The bucket must have Object Lock enabled (and so
versioning). Immutable files are written only if absent (``If-None-Match: *``); the
checkpoint gets a new locked version on every publish, which keeps its history.

Any S3 API works: boto3 reads the endpoint from ``AWS_ENDPOINT_URL`` (MinIO, a test
server) and credentials from its usual chain.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ledger.errors import BackendUnavailableError, InvalidInputError
from ledger.publish.sink import ImmutableTileError
from ledger.tiles import CHECKPOINT_PATH

DEFAULT_RETENTION_DAYS = 2557  # seven years: longer than SEC 17a-4's six


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (bucket, ``some/prefix/``)."""
    if not url.startswith("s3://"):
        raise InvalidInputError("--to", "an S3 location is s3://bucket[/prefix]")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise InvalidInputError("--to", "an S3 location names a bucket")
    prefix = prefix.strip("/")
    return bucket, prefix + "/" if prefix else ""


class S3Sink:
    def __init__(self, bucket: str, prefix: str = "", *, retention_days: int =
                 DEFAULT_RETENTION_DAYS, client: Any = None) -> None:
        if retention_days < 1:
            raise InvalidInputError("retention_days", "must be at least one day")
        if client is None:
            import boto3  # the S3 extra: only publishers and restorers of buckets need it

            client = boto3.client("s3")
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.retention = timedelta(days=retention_days)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Sink:
        bucket, prefix = parse_s3_url(url)
        return cls(bucket, prefix, **options)

    def get(self, path: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.prefix + path)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise BackendUnavailableError(f"S3 get {path}: {_code(exc)}") from exc
        return bytes(answer["Body"].read())

    def put_immutable(self, path: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        existing = self.get(path)
        if existing is not None:
            if existing != data:
                raise ImmutableTileError(path)
            return
        try:
            self._put(path, data, "public, max-age=31536000, immutable", IfNoneMatch="*")
        except ClientError as exc:
            if _code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
                if self.get(path) != data:  # a concurrent publisher wrote it first
                    raise ImmutableTileError(path) from exc
                return
            raise BackendUnavailableError(f"S3 put {path}: {_code(exc)}") from exc

    def put_checkpoint(self, data: bytes) -> None:
        from botocore.exceptions import ClientError

        try:
            self._put(CHECKPOINT_PATH, data, "no-cache", content_type="text/plain; "
                      "charset=utf-8")
        except ClientError as exc:
            raise BackendUnavailableError(f"S3 put checkpoint: {_code(exc)}") from exc

    def _put(self, path: str, data: bytes, cache: str,
             content_type: str = "application/octet-stream", **extra: Any) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self.prefix + path, Body=data, ContentType=content_type,
            CacheControl=cache, ObjectLockMode="COMPLIANCE",
            ObjectLockRetainUntilDate=datetime.now(UTC) + self.retention,
            ChecksumAlgorithm="SHA256", **extra)


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", "error"))
