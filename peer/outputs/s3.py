"""S3-compatible object storage, as the uploader needs it: put one file under one key and prove it arrived.

The requests are signed (SigV4) and sent by botocore, run in trio's worker threads (`trio.to_thread`) one
step at a time, so no asyncio bridge is needed and a step is never longer than one part's transfer. botocore
is imported only when a node uploads: it costs about a second of start-up and some tens of MB.

Each file is read and hashed once, here (`file_digest`): its SHA-256, which goes with the object as metadata
(`x-amz-meta-sha256`) for consumers, and, for a file sent in parts, each part's SHA-256. Every PUT carries its
body's SHA-256 as S3's `x-amz-checksum-sha256`, a signed header the server checks the body against (it refuses
a body that does not match), so the signature does not hash the body again (`UNSIGNED-PAYLOAD`, botocore's
`payload_signing_enabled` off). A file is then checked by what the server says of the stored object, not by
what was sent: its size, and the SHA-256 checksum the server keeps (the file's, or for a multipart object the
SHA-256 of the parts' SHA-256s and a part count, S3's composite checksum). A server that keeps no checksums is
checked by the object's ETag instead (the MD5 of a single-part object, the MD5 of the parts' MD5s and a part
count for a multipart one), for which the file is read once more.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import urlsplit

from peer.config import Config, ConfigError

__all__ = ["FileDigest", "ObjectStore", "S3Target", "Stored", "UploadError", "file_digest", "file_etag", "parse_s3_url"]

#: S3 refuses parts smaller than this, except the last.
MIN_PART = 5 << 20
_READ = 1 << 20


class UploadError(Exception):
    """An upload step failed; `kind` says whose fault: unreachable, credentials, bucket, verify or server."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://BUCKET/PREFIX` to (bucket, prefix without slashes at its ends)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"upload: expected s3://BUCKET/PREFIX, got {url!r}")
    return parts.netloc, parts.path.strip("/")


@dataclass(frozen=True, slots=True, kw_only=True)
class S3Target:
    """Where and as whom to upload."""

    bucket: str
    prefix: str
    endpoint: str  # empty: AWS's own endpoint for the region
    region: str
    access_key: str
    secret_key: str

    @classmethod
    def from_config(cls, cfg: Config, env: Mapping[str, str]) -> S3Target:
        """From `upload` and the `upload_*` settings; an empty setting falls back to the usual AWS_* variable."""
        bucket, prefix = parse_s3_url(cfg.upload)
        target = cls(bucket=bucket, prefix=prefix,
                     endpoint=cfg.upload_endpoint or env.get("AWS_ENDPOINT_URL", ""),
                     region=cfg.upload_region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
                     access_key=cfg.upload_access_key or env.get("AWS_ACCESS_KEY_ID", ""),
                     secret_key=cfg.upload_secret_key or env.get("AWS_SECRET_ACCESS_KEY", ""))
        if not target.access_key or not target.secret_key:
            raise ConfigError("upload needs credentials: upload_access_key and upload_secret_key, or "
                              "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        return target

    def key(self, node_id: str, name: str) -> str:
        """The object key of a node's file: one key per (node, file), so a repeat overwrites, never adds."""
        return "/".join(part for part in (self.prefix, node_id, name) if part)

    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class FileDigest(NamedTuple):
    size: int
    sha256: str  # hex
    checksum: str  # the ChecksumSHA256 S3 gives the object sent in parts of `part_size` (base64; "-N": N parts)
    parts: tuple[str, ...]  # each part's SHA-256 (base64); one: a single PUT


class Stored(NamedTuple):
    """What the server says of an object."""

    size: int
    etag: str
    sha256: str  # the `sha256` metadata ("": none)
    checksum: str  # its SHA-256 checksum ("": the server keeps none)


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _part_chunks(fh: BinaryIO, part_size: int) -> Iterator[tuple[int, bytes]]:
    """(part number, chunk) over what is left of `fh`, read in parts of `part_size` bytes as an upload sends
    them; an empty file yields nothing."""
    part, left = 0, part_size
    while True:
        chunk = fh.read(min(_READ, left))
        if not chunk:
            return
        yield part, chunk
        left -= len(chunk)
        if not left:
            part, left = part + 1, part_size


def file_digest(path: str | os.PathLike[str], part_size: int) -> FileDigest:
    """Size, SHA-256 and expected S3 checksum of a file, read once: a file of one part is hashed once, a larger
    one also part by part."""
    whole = hashlib.sha256()
    parts: list[Any] = []  # a larger file's hash of each part
    size = 0
    with open(path, "rb") as fh:
        multipart = os.fstat(fh.fileno()).st_size > part_size
        for n, chunk in _part_chunks(fh, part_size):
            whole.update(chunk)
            size += len(chunk)
            if multipart:
                if n == len(parts):
                    parts.append(hashlib.sha256())
                parts[n].update(chunk)
    sums: tuple[str, ...]
    if len(parts) <= 1:
        sums = (_b64(whole.digest()),)
        checksum = sums[0]
    else:
        digests = [part.digest() for part in parts]
        sums = tuple(_b64(d) for d in digests)
        checksum = f"{_b64(hashlib.sha256(b''.join(digests)).digest())}-{len(digests)}"
    return FileDigest(size=size, sha256=whole.hexdigest(), checksum=checksum, parts=sums)


def file_etag(path: str | os.PathLike[str], part_size: int) -> str:
    """The ETag S3 gives a file uploaded in parts of `part_size` (quoted, as S3 sends it): for a server that keeps
    no checksums."""
    md5s: list[Any] = []
    with open(path, "rb") as fh:
        for n, chunk in _part_chunks(fh, part_size):
            if n == len(md5s):
                md5s.append(hashlib.md5(usedforsecurity=False))
            md5s[n].update(chunk)
    if len(md5s) <= 1:
        return f'"{(md5s[0] if md5s else hashlib.md5(usedforsecurity=False)).hexdigest()}"'
    digests = b"".join(part.digest() for part in md5s)
    return f'"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(md5s)}"'


class ObjectStore:
    """The S3 calls of an upload, each synchronous (run them in a worker thread)."""

    def __init__(self, target: S3Target, *, part_size: int, timeout: float = 30.0) -> None:
        if part_size < MIN_PART:
            raise ConfigError(f"upload_part_bytes must be at least {MIN_PART} (S3's smallest part), got {part_size}")
        self.target = target
        self.part_size = part_size
        self.timeout = timeout
        self._client: Any = None

    def connect(self) -> None:
        """Load the client library and build the client now (about a second of CPU), rather than at the first
        upload: a node does it at start, before it says it is up."""
        self._s3()

    def _s3(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config as BotoConfig

            t = self.target
            # one attempt per call: the uploader retries with its own back-off and reports each failure
            config = BotoConfig(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=self.timeout,
                                read_timeout=self.timeout,
                                s3={"addressing_style": "path", "payload_signing_enabled": False},
                                signature_version="s3v4",
                                # the body's check is the SHA-256 checksum given with it (file_digest): neither
                                # a CRC32 pass nor a SHA-256 for the signature over every body too
                                request_checksum_calculation="when_required",
                                response_checksum_validation="when_required")
            session = boto3.session.Session()
            self._client = session.client("s3", endpoint_url=t.endpoint or None, region_name=t.region,
                                          aws_access_key_id=t.access_key, aws_secret_access_key=t.secret_key,
                                          config=config)
        return self._client

    def _call(self, op: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        try:
            return getattr(self._s3(), op)(Bucket=self.target.bucket, **kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in ("404", "NoSuchKey", "NotFound") and op == "head_object":
                return None
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403") or status == 403:
                raise UploadError("credentials", f"{op}: the server refused the credentials ({code or status})") from exc
            if code == "NoSuchBucket":
                raise UploadError("bucket", f"{op}: no bucket {self.target.bucket!r}") from exc
            raise UploadError("server", f"{op}: {code or status} {error.get('Message', '')}".strip()) from exc
        except EndpointConnectionError as exc:
            raise UploadError("unreachable", f"{op}: cannot reach {self.target.endpoint or 'S3'}: {exc}") from exc
        except BotoCoreError as exc:
            raise UploadError("unreachable", f"{op}: {type(exc).__name__}: {exc}") from exc

    # -- the steps of an upload

    def head(self, key: str) -> Stored | None:
        """What the server says of the object at `key`, or None."""
        got = self._call("head_object", Key=key, ChecksumMode="ENABLED")
        if got is None:
            return None
        return Stored(size=int(got["ContentLength"]), etag=str(got["ETag"]),
                      sha256=str(got.get("Metadata", {}).get("sha256", "")),
                      checksum=str(got.get("ChecksumSHA256", "")))

    def put(self, path: Path, key: str, digest: FileDigest) -> None:
        with open(path, "rb") as fh:
            self._call("put_object", Key=key, Body=fh, ContentLength=digest.size, ChecksumSHA256=digest.parts[0],
                       Metadata={"sha256": digest.sha256})

    def abort_stale(self, key: str) -> int:
        """Abort multipart uploads of `key` left by an earlier run (killed mid-upload); return how many."""
        got = self._call("list_multipart_uploads", Prefix=key)
        stale = [u for u in got.get("Uploads", []) if u.get("Key") == key]
        for upload in stale:
            self._call("abort_multipart_upload", Key=key, UploadId=upload["UploadId"])
        return len(stale)

    def start_parts(self, key: str, digest: FileDigest) -> str:
        got = self._call("create_multipart_upload", Key=key, ChecksumAlgorithm="SHA256",
                         Metadata={"sha256": digest.sha256})
        return str(got["UploadId"])

    def put_part(self, path: Path, key: str, upload_id: str, number: int, digest: FileDigest) -> str:
        """Send part `number` (from 1) of the file; return its ETag."""
        with open(path, "rb") as fh:
            fh.seek((number - 1) * self.part_size)
            body = fh.read(self.part_size)
        got = self._call("upload_part", Key=key, UploadId=upload_id, PartNumber=number, Body=body,
                         ChecksumSHA256=digest.parts[number - 1])
        return str(got["ETag"])

    def finish_parts(self, key: str, upload_id: str, etags: list[str], digest: FileDigest) -> None:
        parts = [{"PartNumber": n, "ETag": etag, "ChecksumSHA256": digest.parts[n - 1]}
                 for n, etag in enumerate(etags, 1)]
        self._call("complete_multipart_upload", Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})

    def matches(self, stored: Stored, path: Path, digest: FileDigest) -> bool:
        """Whether the stored object is the file: its size, and its checksum (its ETag, read from the file again,
        on a server that keeps no checksums)."""
        if stored.size != digest.size:
            return False
        if stored.checksum:
            return stored.checksum == digest.checksum
        return stored.etag == file_etag(path, self.part_size)

    def verify(self, key: str, path: Path, digest: FileDigest) -> str:
        """The stored object's ETag if it is the file (`matches`); UploadError('verify') otherwise."""
        got = self.head(key)
        if got is None:
            raise UploadError("verify", f"{key}: not in the bucket after its upload")
        if not self.matches(got, path, digest):
            raise UploadError("verify", f"{key}: the stored object is {got.size} bytes, checksum "
                                        f"{got.checksum or '(none)'}, ETag {got.etag}; the file is {digest.size} "
                                        f"bytes, checksum {digest.checksum}")
        return got.etag
