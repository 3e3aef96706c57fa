"""What a node hands on to the outside (DESIGN decision 13): closed WARC files and their indexes to object
storage, a signed webhook for each file uploaded or closed, and the crawl log (one record per finished URL) to
rotating local files and a Redis stream. Each output is queued durably in the node's store and sent by a task that retries; a slow or dead
receiver never stalls the crawl, and shows in /status, /metrics and the dashboard."""

from peer.outputs.captures import LocalIndex, cdx_body, parse_cdx_query
from peer.outputs.crawllog import CrawlLog, LocalLog, StreamLog
from peer.outputs.s3 import ObjectStore, S3Target, UploadError, file_digest, file_etag, parse_s3_url
from peer.outputs.uploads import Uploader
from peer.outputs.webhook import WebhookSender, notice_body, sign

__all__ = ["LocalIndex", "cdx_body", "parse_cdx_query", "CrawlLog", "LocalLog", "StreamLog", "ObjectStore", "S3Target", "UploadError", "Uploader", "WebhookSender", "file_digest", "file_etag", "notice_body",
           "parse_s3_url", "sign"]
