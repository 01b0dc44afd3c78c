"""Uploads: an upload handler that hashes each file as Django spools it to disk, so that the
sha256 pods cache a document under costs no second read of its bytes
(ocrjobs.services.submission._stage). It is Django's documented upload-handler hook
(FILE_UPLOAD_HANDLERS): Django's own multipart parser reads every body.
"""

from __future__ import annotations

import hashlib

from django.core.files.uploadhandler import TemporaryFileUploadHandler


class HashingTemporaryFileUploadHandler(TemporaryFileUploadHandler):
    def new_file(self, *args, **kwargs) -> None:
        super().new_file(*args, **kwargs)
        self.digest = hashlib.sha256()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self.digest.update(raw_data)
        super().receive_data_chunk(raw_data, start)

    def file_complete(self, file_size: int):
        uploaded = super().file_complete(file_size)
        uploaded.sha256 = self.digest.hexdigest()
        return uploaded
