"""Uploads: the upload handler through which every multipart body is read by
fleetadmin.formdata.FormData, which writes each file to a temporary file of its own and hashes it
on the way (the sha256 pods cache a document under costs no second read of its bytes:
ocrjobs.services.submission.stage_upload moves the file into place). It is Django's documented hook
for a parser of one's own (FILE_UPLOAD_HANDLERS, ``handle_raw_input``): a body the front read as
it arrived is taken as it is; any other (another server, the test client) is read from the
request's stream.
"""

from __future__ import annotations

from django.core.files.uploadhandler import FileUploadHandler

from fleetadmin import formdata

# A body read from the request's stream is read this much at a time.
READ_BYTES = 1024 * 1024


class FormDataUploadHandler(FileUploadHandler):
    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        form = formdata.received.get()
        if form is None:
            form = formdata.FormData(boundary)
            try:
                while chunk := input_data.read(READ_BYTES):
                    form.write(chunk)
            except BaseException:
                form.close()
                raise
        return form.finish(encoding)

    # Never called: handle_raw_input answers for every body (Django's parser does not run).
    def receive_data_chunk(self, raw_data, start):
        raise NotImplementedError

    def file_complete(self, file_size):
        raise NotImplementedError
