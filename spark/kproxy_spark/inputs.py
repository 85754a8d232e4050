"""Where the analysis's inputs live: a local path, or a URI any Hadoop file system reads.

A plain path or a file:// URI is local and stays on the local code path
(pathlib, open(): no py4j call, no Spark job). Any other scheme (hdfs://,
s3a://, viewfs://, ...) is listed, sized, checked and read on the driver
through Hadoop's FileSystem API in the session's JVM, configured as Spark
is (`spark.hadoop.*`); the executors read such files with Spark's own
readers (kproxy_spark.traces.load_remote_traces).
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path
from urllib.parse import unquote, urlparse


class RemoteInputError(Exception):
    """A remote input cannot be reached, listed or read (the analysis exits 2)."""


def is_remote(path: str | os.PathLike | None) -> bool:
    """A URI with a scheme other than file://: Hadoop's to read."""
    if path is None:
        return False
    scheme, sep, _ = str(path).partition("://")
    return bool(sep) and scheme.lower() != "file"


def local_path(path: str | os.PathLike) -> str:
    """A local path as the operating system names it (a file:// URI unwrapped)."""
    text = str(path)
    if text.lower().startswith("file://"):
        return unquote(urlparse(text).path)
    return text


def with_uri(message: str, uri: str) -> str:
    """A message that names `uri` through pathlib, which folds a URI's "//" into "/", with the URI back."""
    return message.replace(str(Path(uri)), uri, 1)


def base_name(uri: str) -> str:
    """The last element of a URI or path."""
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _java_message(exc: Exception) -> str:
    """A py4j error's Java exception as one line (no stack trace)."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return str(exc).splitlines()[0]
    # The root cause says what is missing (a class, a host, a credential).
    while java.getCause() is not None:
        java = java.getCause()
    return f"{java.getClass().getName()}: {java.getMessage()}"


class HadoopPath:
    """One URI on its Hadoop file system, through the session's JVM."""

    def __init__(self, spark, uri: str) -> None:  # a classic SparkSession
        jvm = getattr(spark, "_jvm", None)
        if jvm is None:
            # A Spark Connect client has no JVM to list with; its server reads what it is told to.
            raise RemoteInputError(f"{uri}: inputs on a Hadoop file system are listed and checked through the "
                                   "driver's JVM, which a Spark Connect client does not have; analyse them with "
                                   "--master (docs/analysis.md, \"Inputs on HDFS, S3 or any Hadoop file system\")")
        self.uri = uri
        self._path = jvm.org.apache.hadoop.fs.Path(uri)
        try:
            self._fs = self._path.getFileSystem(spark._jsc.hadoopConfiguration())
        except Exception as exc:  # noqa: BLE001 - py4j's Py4JJavaError, whatever Java threw
            raise RemoteInputError(
                f"{uri}: no Hadoop file system opens it ({_java_message(exc)}); s3a:// needs hadoop-aws on the "
                "classpath (docs/analysis.md, \"Inputs on HDFS, S3 or any Hadoop file system\")") from None

    def _call(self, what: str, call):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - py4j's Py4JJavaError, whatever Java threw
            raise RemoteInputError(f"{self.uri}: cannot {what}: {_java_message(exc)}") from None

    def kind(self) -> str | None:
        """"file", "directory", or None when nothing is there."""
        if not self._call("look it up", lambda: self._fs.exists(self._path)):
            return None
        status = self._call("look it up", lambda: self._fs.getFileStatus(self._path))
        return "directory" if status.isDirectory() else "file"

    def size(self) -> int:
        """Bytes under the URI (a file's length, or a directory's files summed)."""
        return self._call("size it", lambda: self._fs.getContentSummary(self._path).getLength())

    def files(self) -> list[tuple[str, int]]:
        """(URI, length) of every file under the directory, recursively, sorted by URI."""
        def walk() -> list[tuple[str, int]]:
            found = []
            listing = self._fs.listFiles(self._path, True)
            while listing.hasNext():
                status = listing.next()
                found.append((status.getPath().toString(), status.getLen()))
            return found

        return sorted(self._call("list it", walk))

    def open(self) -> io.BufferedReader:
        """The file for reading (seekable), e.g. for a header or a Parquet footer."""
        stream = self._call("open it", lambda: self._fs.open(self._path))
        length = self._call("size it", lambda: self._fs.getFileStatus(self._path).getLen())
        return io.BufferedReader(_HadoopStream(stream, length, self.uri), buffer_size=64 * 1024)


class _HadoopStream(io.RawIOBase):
    """A Hadoop FSDataInputStream as a Python raw stream: each read is one py4j call returning bytes."""

    def __init__(self, stream, length: int, uri: str) -> None:
        super().__init__()
        self._stream, self._length, self.name = stream, length, uri

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        # readNBytes returns a byte[], which py4j hands over as bytes in one transfer.
        data = self._stream.readNBytes(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.tell(), io.SEEK_END: self._length}[whence]
        self._stream.seek(base + offset)
        return base + offset

    def tell(self) -> int:
        return self._stream.getPos()

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


def require(spark, uri: str, kind: str, label: str) -> HadoopPath:
    """The URI on its file system; a RemoteInputError naming it when it is not a `kind` there."""
    path = HadoopPath(spark, uri)
    if path.kind() != kind:
        raise RemoteInputError(f"{label} not found: {uri}")
    return path


def check_remote_version(spark, uri: str) -> None:  # a classic SparkSession
    """check_file_version for a trace file on a Hadoop file system: a TraceFileError if it was written
    under a schema version this kproxy does not read. Reads its header or first line only."""
    with HadoopPath(spark, uri).open() as f:
        _check_version_of(f, uri)


def _check_version_of(f, uri: str) -> None:  # a seekable binary file
    if uri.endswith(".events"):
        _check_segment_header(f, uri)
    elif uri.endswith(".parquet"):
        _check_parquet_versions(f, uri)
    else:
        _check_first_line(gzip.GzipFile(fileobj=f) if uri.endswith(".gz") else f, uri)


def _check_segment_header(f, uri: str) -> None:
    from kproxy.obs.trace_files import TraceFileError
    from kproxy.obs.trace_segments import FILE_MAGIC, SegmentError, SegmentFile

    head = f.read(len(FILE_MAGIC) + 4)
    whole = len(head) == len(FILE_MAGIC) + 4 and head.startswith(FILE_MAGIC)
    header = f.read(int.from_bytes(head[len(FILE_MAGIC):], "little")) if whole else b""
    try:
        SegmentFile(uri, data=head + header)  # the header alone: magic and version are checked
    except SegmentError as exc:
        raise TraceFileError(with_uri(str(exc), uri)) from None


def _check_parquet_versions(f, uri: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kproxy.obs.trace_files import check_version

    try:
        versions = pq.read_table(f, columns=["schema_version"]).column(0).unique().to_pylist()
    except (pa.ArrowInvalid, OSError, KeyError):
        return  # unreadable (no footer yet) or without versions: the reader reports what it finds
    for version in versions:
        check_version(version, uri)


def _check_first_line(f, uri: str) -> None:
    from kproxy.obs.trace_files import TraceFileError, read_event_line

    try:
        first = f.readline()
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFileError(f"{uri}: not a readable trace: {exc}") from None
    if first.endswith(b"\n"):  # else no complete event yet
        read_event_line(first, f"{uri}:1")

