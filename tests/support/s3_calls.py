"""Counting the S3 API calls s3fs makes (importable as ``support.s3_calls``)."""

from __future__ import annotations


def count_s3_calls(monkeypatch) -> list[str]:
    """Every S3 API call s3fs makes from now on, by name (``get_object``, ...), in the
    order made; the list grows as calls are made."""
    import s3fs

    calls: list[str] = []
    call = s3fs.S3FileSystem._call_s3

    async def counting(self, method, *args, **kwargs):
        calls.append(getattr(method, "__name__", str(method)))
        return await call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    return calls
