"""Query parameters sent in the body as a form, as ClickHouse's HTTP interface accepts them.

clickhouse-connect moves a query and its bound parameters into a multipart/form-data body when
the parameters would make the URL too long (more than 4 KiB of them: a few hundred request ids
in `has({ids:Array(String)}, request_id)`). Before this, the sidecar read such a body as SQL and
answered a syntax error. The fields are `query`, `param_<name>` and settings, merged over the URL's
parameters; a file part (ClickHouse's external tables) is refused, not ignored.
"""

from __future__ import annotations

from email.parser import BytesParser
from email.policy import HTTP
from urllib.parse import parse_qsl

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
# strict codecs that cannot produce a lone surrogate (which no later .encode() survives)
_CHARSETS = {"utf-8", "utf8", "us-ascii", "ascii", "latin-1", "latin1", "iso-8859-1"}


class FormError(ValueError):
    pass


def is_form(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() in FORM_TYPES


def form_fields(content_type: str, body: bytes) -> dict[str, str]:
    """The form's fields (name -> text). Raises FormError for a malformed form or a file part."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        try:
            return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body)))
        except (UnicodeDecodeError, ValueError) as e:
            raise FormError(f"malformed form body: {e}") from None
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n"
                                                   + body)
    if not message.is_multipart():
        raise FormError("malformed multipart/form-data body (no parts: is the boundary right?)")
    fields = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            raise FormError("a multipart/form-data part without a name")
        if part.get_filename() is not None:
            raise FormError(f"form part {name!r} is a file: external tables are not supported by the sidecar")
        payload = part.get_payload(decode=True) or b""
        charset = (part.get_content_charset() or "utf-8").lower()
        if charset not in _CHARSETS:  # a codec of the client's choosing (unicode_escape, utf-7) makes any string
            raise FormError(f"form field {name!r}: charset {charset!r} is not accepted (utf-8, us-ascii, latin-1)")
        try:
            fields[name] = payload.decode(charset)
        except UnicodeDecodeError as e:
            raise FormError(f"form field {name!r}: {e}") from None
    return fields
