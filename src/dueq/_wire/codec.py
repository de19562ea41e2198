"""Payload codecs: a task's payload sealed with AES-256-GCM and/or compressed with zstd.

Only the payload is sealed. The envelope's head (priority, timeout, max attempts, expiry, key:
``envelope.py``) and its name/trace line stay plaintext, because the Lua scripts read the head
(``task_options`` in ``lua/include/levels.lua``) and a claim routes a named task by its name.
A sealed payload is stored after those lines as one codec line and the sealed bytes::

    %<compression>|<key id>\\n<bytes>

    %z|\\n<zstd frame>                          compressed only
    %|k2\\n<12-byte nonce><ciphertext + tag>    encrypted with key k2
    %z|k2\\n<12-byte nonce><ciphertext + tag>   compressed, then encrypted

``%`` cannot start a JSON text (nor a trace line, ``~``), so one byte tells whether a payload is
sealed, a task stored before codecs reads as before, and a reader from before codecs refuses a
sealed payload as unreadable (PayloadError: the task goes dead with its data kept) instead of
running it with a wrong payload. The scripts never read past the head, so nothing in Lua
changes.

**Associated data.** The AES-GCM tag authenticates, besides the ciphertext, the queue's name,
the task's id and the codec line itself (so neither the key id nor the compression flag can be
changed). A ciphertext copied onto another task (or another queue) fails authentication: that
task goes dead with ``UndecryptableTask``. The due time is *not* authenticated although it is
known when a task is written: reschedule.lua, retries, releases, debounce and ``ctx.sleep``
move a task's due time inside the scripts, which cannot (and must not) re-seal it, so a due
time in the tag would make every rescheduled task undecryptable. What is authenticated never
changes for a task. The queue name authenticated is the *logical* one: a shard's name
``emails#3`` (or ``emails#3.1``) counts as ``emails``, since resharding moves a task between
shards with its envelope untouched (and a plain queue named ``emails#3`` shares that shard's
keys, so it is the same key space).

**Cron definitions** are sealed once, when added, before any occurrence id exists: their
payload is bound to the queue and ``cron:<name>`` with the purpose ``cron``, and every
occurrence carries that body. An occurrence's payload opens with its own id first, then, for
an id of an occurrence's shape only, with its definition's binding (so an ordinary task whose
id looks like an occurrence's opens as its own, and no other task's ciphertext fits a
definition's). Within one definition its occurrences' ciphertexts are interchangeable: they
carry the same payload. Rotation re-seals a stored occurrence for its own id.

**Compression** runs before encryption (ciphertext does not compress). It leaks the compressed
size, as every compress-then-encrypt scheme does: a payload that mixes attacker-chosen text with
a secret can reveal the secret by its size over many tries (CRIME/BREACH); turn compression off
for such payloads. A payload whose compressed form is not smaller is stored uncompressed.

**Keys.** ``Encrypted(keys=...)`` takes a mapping of key id to 32-byte key, a callable
``key_id -> bytes | None`` (a KMS lookup: each id is asked once and kept), or nothing: then
``DUEQ_KEYS`` in the environment, ``id=base64key`` entries separated by commas
(``DUEQ_KEYS="k1=<base64>,k2=<base64>"``); the active key is ``active=``, else
``DUEQ_ACTIVE_KEY``, else the last listed (with one key, that key). Writers seal with the active
key; readers open with any known key, which is what lets keys rotate without downtime
(``reseal`` re-encrypts a stored payload with another key for ``q.rotate_key``:
``_flows/rotate.py``). A key id
no source knows, or a tag that does not verify, is ``UndecryptableTask`` (a PayloadError): a
claim sends the task to dead at once (no retry makes it readable) with its envelope untouched,
so it can be replayed once the key is back. An exception raised by a key callable (a KMS
outage) is no verdict on the task: it passes through.

**Reading costs one decrypt.** A claim opens every payload it returns, so ``open`` does per
task only what depends on the task: one AESGCM per key id is made once (its key schedule), a
payload's codec line and queue name find that cipher, the queue's part of the associated data
and the compression flag with one lookup (``PayloadCodec._open_fast``; the first payload of a
line, a value other than a payload and every refusal take the general path, which says why),
and the ciphertext is decrypted where
it lies in the envelope (no copy of the body first); ``envelope.decode_named`` hands it a sealed
``1:`` envelope from its fast path. What is checked is unchanged: the codec line, the key id,
and the tag over queue, task id and codec line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import struct
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, NoReturn

from dueq.exceptions import ConfigurationError, PayloadError, UndecryptableTask

#: The first byte of a sealed payload (see the module docstring): no JSON text starts with it.
SEAL_MARK = b"%"
#: The compression flag of a codec line.
ZSTD_FLAG = b"z"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
#: A key id: what the envelope records with each ciphertext.
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: A shard's suffix (``sharding.layout.shard_names``): ``#<i>`` or ``#<i>.<k>``.
_SHARD_SUFFIX = re.compile(r"(.+)#[0-9]+(?:\.[0-9]+)?")
_CODEC_LINE = re.compile(rb"%(z?)\|([A-Za-z0-9_.-]{0,64})\n")
#: Payloads of at least this many bytes of JSON are compressed with compression="auto".
AUTO_COMPRESS_BYTES = 256
#: The zstd level: zstd's default, fast and about as small as level 9 for JSON of this size.
ZSTD_LEVEL = 3
#: The largest payload a compressed frame may claim to hold (a queue's largest payload limit):
#: a corrupt or hostile frame cannot make a reader allocate more.
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
#: The tag of the associated data's layout (changing the layout needs a new tag).
_AAD_TAG = b"dueq-aead-1"
_SHORT = struct.Struct(">H")

Compression = Literal["zstd", "auto"]
KeySource = Mapping[str, bytes] | Callable[[str], "bytes | None"]


def _zstd_module() -> Any:
    """The zstd implementation: Python 3.14's ``compression.zstd``, else the ``zstandard``
    package; None when neither is there."""
    if sys.version_info >= (3, 14):
        from compression import zstd

        return zstd
    try:
        import zstandard
    except ImportError:  # optional extra: the caller says which to install
        return None
    return zstandard


class _Zstd:
    """One-shot zstd compression over whichever implementation is installed (zstandard's
    compressor objects are not safe to share between threads: one per thread)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.local = threading.local()

    def compress(self, data: bytes) -> bytes:
        if self.module.__name__ != "zstandard":
            return bytes(self.module.compress(data, level=ZSTD_LEVEL))
        compressor = getattr(self.local, "compressor", None)
        if compressor is None:
            compressor = self.local.compressor = self.module.ZstdCompressor(level=ZSTD_LEVEL)
        return bytes(compressor.compress(data))

    def decompress(self, data: bytes) -> bytes:
        try:
            if self.module.__name__ != "zstandard":
                return bytes(self.module.decompress(data))
            size = self.module.frame_content_size(data)
            if size < 0 or size > MAX_DECOMPRESSED_BYTES:
                raise PayloadError("stored compressed payload has no size or is too large")
            decompressor = getattr(self.local, "decompressor", None)
            if decompressor is None:
                decompressor = self.local.decompressor = self.module.ZstdDecompressor()
            return bytes(decompressor.decompress(data))
        except PayloadError:
            raise
        except Exception as exc:  # each implementation has its own error types: all corrupt
            raise PayloadError(f"stored compressed payload is corrupt: {exc}") from None


_ZSTD: _Zstd | None = None
_ZSTD_LOCK = threading.Lock()


def zstd() -> _Zstd | None:
    """The process's zstd codec (made once), or None when no implementation is installed."""
    global _ZSTD
    if _ZSTD is None:
        with _ZSTD_LOCK:
            module = _zstd_module()
            if module is not None and _ZSTD is None:
                _ZSTD = _Zstd(module)
    return _ZSTD


def _validate_key_id(key_id: object) -> str:
    if not isinstance(key_id, str) or _KEY_ID.fullmatch(key_id) is None:
        raise ConfigurationError(
            f"a key id is 1 to 64 characters of ASCII letters, digits and _ . -, got {key_id!r}"
        )
    return key_id


def _validate_key(key_id: str, key: object) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        what = f"{len(key)} bytes" if isinstance(key, (bytes, bytearray)) else type(key).__name__
        raise ConfigurationError(
            f"key {key_id!r} must be {KEY_BYTES} bytes (AES-256), got {what}: make one with "
            "os.urandom(32)"
        )
    return bytes(key)


def parse_keys(listed: str, where: str = "DUEQ_KEYS") -> dict[str, bytes]:
    """The keys of a ``"k1=<base64>,k2=<base64>"`` text (``DUEQ_KEYS``' format; ``where`` names
    the setting it came from in errors, which never show a key); ConfigurationError when it is
    empty or malformed."""
    if not listed.strip():
        raise ConfigurationError(f'{where} lists no key: "k1=<base64 of 32 bytes>,k2=..."')
    keys: dict[str, bytes] = {}
    for position, entry in enumerate(listed.strip().split(",")):
        key_id, equals, encoded = entry.strip().partition("=")
        if not equals:
            raise ConfigurationError(
                f"{where} entry {position} is not id=<base64 key> (key ids hold no '=')"
            )
        key_id = _validate_key_id(key_id)
        try:
            raw = base64.b64decode(
                encoded.strip().replace("-", "+").replace("_", "/"), validate=True
            )
        except (binascii.Error, ValueError):
            raise ConfigurationError(f"{where} key {key_id!r} is not base64") from None
        keys[key_id] = _validate_key(key_id, raw)
    return keys


def keys_from_environment(environ: Mapping[str, str] | None = None) -> tuple[dict[str, bytes], str]:
    """The keys and active key id of ``DUEQ_KEYS`` and ``DUEQ_ACTIVE_KEY`` (see the module
    docstring); ConfigurationError when they are missing or malformed (never showing a key)."""
    env = os.environ if environ is None else environ
    listed = env.get("DUEQ_KEYS", "").strip()
    if not listed:
        raise ConfigurationError(
            "dueq.Encrypted() without keys= reads DUEQ_KEYS, which is not set: "
            'DUEQ_KEYS="k1=<base64 of 32 bytes>,k2=<base64 of 32 bytes>"'
        )
    keys = parse_keys(listed)
    active = env.get("DUEQ_ACTIVE_KEY", "").strip() or list(keys)[-1]
    return keys, active


class Encrypted:
    """Seal task payloads with AES-256-GCM (the ``cryptography`` package: ``pip install
    dueq[crypto]``): ``Queue(..., codec=dueq.Encrypted(keys={"k1": key}, active="k1"))``.

    ``keys`` maps key ids to 32-byte keys, or is a callable ``key_id -> bytes | None`` (a KMS:
    each id is asked once and its key kept), or is left out to read ``DUEQ_KEYS``
    (``"k1=<base64>,k2=<base64>"``) and ``DUEQ_ACTIVE_KEY``. ``active`` is the key id writers
    seal with (with one listed key it may be left out); readers open with any key they know.
    See docs/payload-codecs.md.
    """

    def __init__(
        self, keys: KeySource | None = None, active: str | None = None, errors: bool = False
    ) -> None:
        #: whether error messages and tracebacks are sealed too (off: operators read them)
        self.errors = bool(errors)
        try:
            from cryptography.exceptions import InvalidTag
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:  # optional extra
            raise ConfigurationError(
                "dueq.Encrypted needs the cryptography package: pip install 'dueq[crypto]'"
            ) from None
        self._aesgcm = AESGCM
        self._invalid_tag = InvalidTag
        self._lookup: Callable[[str], bytes | None] | None = None
        self._ciphers: dict[str, Any] = {}
        #: keys derived from the active key by label (``derived_key``)
        self._derived: dict[bytes, bytes] = {}
        self._lock = threading.Lock()
        if keys is None:
            listed, env_active = keys_from_environment()
            active = env_active if active is None else active
            keys = listed
        #: what it was made from, for pickling (a Spark plan ships it to the executors)
        self._source: KeySource = dict(keys) if isinstance(keys, Mapping) else keys
        if callable(keys):
            if active is None:
                raise ConfigurationError("Encrypted(keys=<callable>) needs active=<key id>")
            self._lookup = keys
        elif isinstance(keys, Mapping):
            if not keys:
                raise ConfigurationError("Encrypted(keys=...) needs at least one key")
            for key_id, key in keys.items():
                self._ciphers[_validate_key_id(key_id)] = AESGCM(_validate_key(key_id, key))
            if active is None:
                if len(keys) > 1:
                    raise ConfigurationError(
                        f"Encrypted has {len(keys)} keys: say which one writers use (active=)"
                    )
                active = next(iter(keys))
            if active not in self._ciphers:
                raise ConfigurationError(f"active key {active!r} is not one of the keys given")
        else:
            raise ConfigurationError(
                "Encrypted(keys=...) takes a mapping of key id to 32-byte key or a callable "
                f"key_id -> bytes | None, got {type(keys).__name__}"
            )
        #: the key id writers seal with
        self.active: str = _validate_key_id(active)
        #: the codec line's key part for what writers seal
        self.line_key = b"|" + self.active.encode("ascii")

    def __repr__(self) -> str:  # never the keys
        known = ", ".join(self._ciphers) or "from a callable"
        return f"Encrypted(active={self.active!r}, keys: {known})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as what it was made from (its ciphers are not picklable): the keys travel
        where the pickle goes, as a Spark job's closure carries them to its executors."""
        return (Encrypted, (self._source, self.active, self.errors))

    def _cipher(self, key_id: str) -> Any:
        """The AESGCM of ``key_id``, or None when no source knows it."""
        cipher = self._ciphers.get(key_id)
        if cipher is not None or self._lookup is None:
            return cipher
        key = self._lookup(key_id)  # a KMS error passes through: no verdict on the task
        if key is None:
            return None
        cipher = self._aesgcm(_validate_key(key_id, key))
        with self._lock:
            self._ciphers[key_id] = cipher
        return cipher

    def derived_key(self, label: bytes) -> bytes:
        """A key for another use than sealing, ``label`` naming the use: HMAC-SHA256 of
        ``label`` keyed by the active key (made once per label). It changes with the active
        key, and tells nothing of the key itself (a Spark row id keyed by it: ``row_id``)."""
        derived = self._derived.get(label)
        if derived is None:
            source = self._source
            key = source(self.active) if callable(source) else source[self.active]
            if key is None:
                raise ConfigurationError(f"the key callable knows no key {self.active!r}")
            key = _validate_key(self.active, key)
            derived = self._derived[label] = hmac.digest(key, label, hashlib.sha256)
        return derived

    def knows(self, key_id: str) -> bool:
        """Whether a key of that id is known (asking the callable if there is one)."""
        return self._cipher(key_id) is not None

    def seal(self, data: bytes, line: bytes, aad: bytes, key_id: str | None = None) -> bytes:
        """``data`` sealed with the active key (or ``key_id``: a rotation's target): nonce,
        ciphertext and tag. ``line`` is the codec line (authenticated with ``aad``)."""
        key_id = self.active if key_id is None else key_id
        cipher = self._cipher(key_id)
        if cipher is None:
            raise ConfigurationError(f"the key callable knows no key {key_id!r}")
        nonce = os.urandom(NONCE_BYTES)
        return nonce + bytes(cipher.encrypt(nonce, data, aad + line))

    def open(
        self, key_id: str, sealed: bytes, line: bytes, aad: bytes, at: int = 0
    ) -> bytes | None:
        """The plaintext of ``sealed[at:]`` (nonce, ciphertext and tag: a caller with the whole
        stored body passes where they start rather than copying them out), or None when the
        key is unknown or the tag fails."""
        cipher = self._ciphers.get(key_id) or self._cipher(key_id)
        if cipher is None or len(sealed) - at < NONCE_BYTES + TAG_BYTES:
            return None
        nonce_end = at + NONCE_BYTES
        try:
            opened: bytes = cipher.decrypt(sealed[at:nonce_end], sealed[nonce_end:], aad + line)
        except self._invalid_tag:
            return None
        return opened


def reseal(
    body: bytes, codec: Encrypted, to: str, queue: str, task_id: str, purpose: bytes = b""
) -> bytes | None:
    """A sealed payload ``body`` (or a value's: ``purpose``) encrypted again with key ``to``
    (``dueq rotate-key``), its compression as it was (the inner bytes are not decompressed: a
    reader without zstd rotates too); None when it is already on ``to`` or not encrypted
    (nothing to do). UndecryptableTask when no key of ``codec`` opens it (the caller leaves it
    as it is). A cron occurrence's payload, sealed for its definition, comes out sealed for
    the occurrence's own id."""
    info = sealed_info(body)
    if info is None or info.key_id is None or info.key_id == to:
        return None
    line_end = body.index(b"\n") + 1
    aad = associated_data(queue, task_id, purpose)
    opened = codec.open(info.key_id, body[line_end:], body[:line_end], aad)
    occurrence = _OCCURRENCE.fullmatch(task_id) if opened is None and not purpose else None
    if occurrence is not None:
        bound = associated_data(queue, occurrence[1], CRON_PURPOSE)
        opened = codec.open(info.key_id, body[line_end:], body[:line_end], bound)
    if opened is None:
        why = "its ciphertext failed authentication" if codec.knows(info.key_id) else "no key"
        what = f"task {task_id!r}" if not purpose else f"the {_what(purpose)} of {task_id!r}"
        raise UndecryptableTask(
            f"{what} cannot be decrypted with key {info.key_id!r}: {why}",
            task_id,
            info.key_id,
        )
    line = b"%" + (ZSTD_FLAG if info.compressed else b"") + b"|" + to.encode("ascii") + b"\n"
    return line + codec.seal(opened, line, aad, key_id=to)


def reseal_value(
    value: Any, codec: Encrypted, to: str, queue: str, task_id: str, purpose: bytes
) -> tuple[Literal["resealed", "already", "unsealed"], Any]:
    """What key rotation does with a decoded JSON ``value`` that ``seal_value`` may have
    sealed (a kept result, a cron definition's payload): ``("resealed", <it sealed with key
    to>)``, ``("already", value)`` when it is on ``to``, ``("unsealed", value)`` when it is
    not encrypted. UndecryptableTask when no key of ``codec`` opens it; PayloadError when it
    is unreadable."""
    body = sealed_body(value)
    info = None if body is None else sealed_info(body)
    if body is None or info is None or info.key_id is None:
        return "unsealed", value
    resealed = reseal(body, codec, to, queue, task_id, purpose)
    if resealed is None:
        return "already", value
    return "resealed", SEALED_VALUE_MARK + base64.b64encode(resealed).decode("ascii")


def revealing(decrypt: bool | Encrypted, asked_by: str = "decrypt") -> Encrypted | None:
    """The codec a view of payloads opens them with: None (each encrypted payload shows as its
    marker, ``<encrypted k2, 412 B>``) unless asked to decrypt. This is the one rule of every
    place that shows payloads to people (the CLI's ``--decrypt``, the dashboard's ``decrypt``
    setting, Spark reads): holding a key is not enough, the user must also ask.

    ``decrypt=True`` opens with the keys of ``DUEQ_KEYS`` (ConfigurationError naming
    ``asked_by`` when it is not set, or malformed); an ``Encrypted`` opens with its own keys (a
    KMS callable). A view only reads, so ``DUEQ_ACTIVE_KEY`` is not consulted."""
    if isinstance(decrypt, Encrypted):
        return decrypt
    if not decrypt:
        return None
    if not os.environ.get("DUEQ_KEYS", "").strip():
        raise ConfigurationError(
            f"{asked_by} opens payloads with the keys in DUEQ_KEYS, which is not set: "
            'DUEQ_KEYS="k1=<base64 of 32 bytes>,k2=..."'
        )
    keys, _active = keys_from_environment({"DUEQ_KEYS": os.environ["DUEQ_KEYS"]})
    return Encrypted(keys=keys, active=next(iter(keys)))


def configured_codec(
    keys: str | KeySource | Encrypted | None,
    active: str | None = None,
    *,
    where: str = "keys",
) -> Encrypted | None:
    """The codec a process that schedules or runs tasks seals and opens payloads with, from
    its settings: the one rule under the CLI (``DUEQ_KEYS``), the Django backend's OPTIONS and
    the Spark writers (the session's configuration), which stay thin over it.

    ``keys``: None or a blank text (no encryption: None), an ``Encrypted`` (as it is), a text
    in ``DUEQ_KEYS``' format, ``"k1=<base64>,k2=<base64>"`` (the active key is ``active``, else
    the last listed), or a mapping or callable as ``Encrypted(keys=)`` takes. ``where`` names
    the setting in errors (which never show a key). Unlike a view (``revealing``), a producer
    or a worker uses its keys without being asked: that is what it holds them for."""
    if keys is None or (isinstance(keys, str) and not keys.strip()):
        if active is not None:
            raise ConfigurationError(f"an active key ({active!r}) is set but {where} lists none")
        return None
    if isinstance(keys, Encrypted):
        if active is not None and active != keys.active:
            raise ConfigurationError(
                f"{where} is an Encrypted with active key {keys.active!r}, not {active!r}"
            )
        return keys
    if isinstance(keys, str):
        listed = parse_keys(keys, where)
        return Encrypted(keys=listed, active=active or list(listed)[-1])
    return Encrypted(keys=keys, active=active)


def environment_codec(environ: Mapping[str, str] | None = None) -> Encrypted | None:
    """``configured_codec`` of ``DUEQ_KEYS`` and ``DUEQ_ACTIVE_KEY``: None when ``DUEQ_KEYS``
    is not set (ConfigurationError when it is malformed, or names no ``DUEQ_ACTIVE_KEY``)."""
    env = os.environ if environ is None else environ
    active = env.get("DUEQ_ACTIVE_KEY", "").strip() or None
    return configured_codec(env.get("DUEQ_KEYS"), active, where="DUEQ_KEYS")


class SealedInfo(NamedTuple):
    """What a codec line says of a stored payload (without opening it)."""

    compressed: bool
    #: the key id it is encrypted with, or None when it is only compressed
    key_id: str | None
    #: bytes stored after the codec line
    size: int

    def marker(self) -> str:
        """How a payload that is not opened shows: ``<encrypted k2, 412 B>``."""
        if self.key_id is None:
            return f"<compressed, {self.size} B>"
        return f"<encrypted {self.key_id}, {self.size} B>"


def sealed_info(body: bytes) -> SealedInfo | None:
    """The codec line of a sealed payload body, or None when it is not one."""
    line_end = body.find(b"\n", 0, 80)
    parsed = _codec_line(body[: line_end + 1]) if line_end > 0 else None
    if parsed is None:
        return None
    return SealedInfo(parsed[0], parsed[1], len(body) - line_end - 1)


#: Codec lines read so far (``%z|k2\n``: whether compressed, the key id or None): a queue's
#: tasks share a few, so a claim finds each here with one dict lookup instead of a pattern
#: match per task. Emptied when it reaches _LINES_KEPT (a hostile Redis cannot grow it).
_LINES: dict[bytes, tuple[bool, str | None]] = {}
_LINES_KEPT = 1024


def _codec_line(line: bytes) -> tuple[bool, str | None] | None:
    """Whether the codec line ``line`` (with its newline) says compressed, and its key id
    (None: not encrypted); None when it is no codec line."""
    parsed = _LINES.get(line)
    if parsed is not None:
        return parsed
    found = _CODEC_LINE.fullmatch(line)
    if found is None:
        return None
    parsed = (bool(found[1]), found[2].decode("ascii") or None)
    if len(_LINES) >= _LINES_KEPT:
        _LINES.clear()
    _LINES[line] = parsed
    return parsed


def logical_queue(name: str) -> str:
    """The queue name a payload is bound to: a shard's (``emails#3``, ``emails#3.1``) is its
    queue's."""
    found = _SHARD_SUFFIX.fullmatch(name)
    return name if found is None else found[1]


def associated_data(queue: str, task_id: str, purpose: bytes = b"") -> bytes:
    """What the tag authenticates besides the ciphertext and the codec line (see the module
    docstring): the logical queue name and the task id, each length-prefixed, then for a value
    other than the payload its purpose, length-prefixed too (a payload has none: its data stays
    as it was sealed before values were)."""
    return _task_data(_queue_data(queue), task_id, purpose)


def _queue_data(queue: str) -> bytes:
    """The start of the associated data of every value of ``queue``: the layout's tag and
    the logical queue name (a PayloadCodec keeps it per queue name: a claim reads many)."""
    q = logical_queue(queue).encode("utf-8")
    return _AAD_TAG + _SHORT.pack(len(q)) + q


def _task_data(queue_data: bytes, task_id: str, purpose: bytes) -> bytes:
    """``associated_data`` from its queue's start (``_queue_data``)."""
    t = task_id.encode("utf-8")
    aad = queue_data + _SHORT.pack(len(t)) + t
    return aad + _SHORT.pack(len(purpose)) + purpose if purpose else aad


#: The purpose of a kept handler result (``keep_results``) in the associated data.
RESULT_PURPOSE = b"result"
#: The purposes of a failed attempt's message and traceback (``Encrypted(errors=True)``).
ERROR_PURPOSE = b"error"
TRACEBACK_PURPOSE = b"traceback"
#: The purpose of a progress entry's body.
PROGRESS_PURPOSE = b"progress"
#: The purpose of a signal's payload (``q.signal``): sealed for the task it is sent to, it
#: stays sealed in the signals the task holds and in the wait's record once taken.
SIGNAL_PURPOSE = b"signal"
#: The purpose of a cron definition's payload, sealed once, when the definition is added, for
#: every occurrence it will have: bound to the queue and ``cron:<name>`` (``cron_binding``),
#: as no occurrence id is known then (``open`` tries it for an occurrence's id).
CRON_PURPOSE = b"cron"
#: Task ids of cron occurrences start with this (``dueq.cron._ids``).
CRON_ID_PREFIX = "cron:"
#: An occurrence id, a slot's (``cron:<name>:<UTC label>``) or a run-now's
#: (``cron:<name>:now:<UTC label>:<8 hex>``), read as ``dueq.cron._ids`` reads them: group 1
#: is its definition's binding.
_OCCURRENCE = re.compile(
    r"(cron:.+):(?:[0-9]{8}T[0-9]{6}Z|now:[0-9]{8}T[0-9]{6}Z:[0-9a-f]{8})", re.DOTALL
)


def cron_binding(name: str) -> str:
    """What a cron definition's payload is bound to in place of a task id."""
    return CRON_ID_PREFIX + name


def step_purpose(position: int) -> bytes:
    """The purpose of the result of the step at ``position`` of a durable task's log: a result
    moved to another step of the same task fails authentication too."""
    return b"step:%d" % position


def _what(purpose: bytes) -> str:
    """A purpose as an error message names it: ``result``, ``step 3 result``."""
    name, _, position = purpose.decode("ascii", "replace").partition(":")
    return f"{name} {position} result" if position else name


class SealedMarker(str):
    """How a sealed value that was not opened shows (``<encrypted k2, 412 B>``), where a
    snapshot shows it (``q.get``, events): a ``str``, so that it prints and serialises as
    the marker, which also carries why it was not opened (``error``: UndecryptableTask, or the
    PayloadError of an unreadable value) for readers that must not take it for the value."""

    error: PayloadError

    def __new__(cls, marker: str, error: PayloadError) -> SealedMarker:
        made = super().__new__(cls, marker)
        made.error = error
        return made


class PayloadCodec:
    """A queue's codec and compression, as ``encode_envelope`` and ``decode_named`` use them.

    A queue with no codec still reads compressed payloads (whoever has zstd can), and reads an
    encrypted one as ``UndecryptableTask``; a queue with a codec reads unsealed payloads too.
    """

    def __init__(self, codec: Encrypted | None = None, compression: str | None = None) -> None:
        if codec is not None and not isinstance(codec, Encrypted):
            raise ConfigurationError(f"codec must be a dueq.Encrypted or None, got {codec!r}")
        if compression not in (None, "zstd", "auto"):
            raise ConfigurationError(
                f'compression must be "zstd", "auto" or None, got {compression!r}'
            )
        if compression is not None and zstd() is None:
            raise ConfigurationError(
                "compression needs zstd: pip install 'dueq[zstd]' (or use Python 3.14)"
            )
        self.codec = codec
        self.compression = compression
        #: payloads of fewer JSON bytes are stored uncompressed
        self.compress_from_bytes = AUTO_COMPRESS_BYTES if compression == "auto" else 1
        #: whether writing changes anything (else encode_envelope stores plain JSON)
        self.writes = codec is not None or compression is not None
        #: the start of the associated data by queue name (``_queue_data``; a queue's codec
        #: sees one name, a sharded one a name per shard)
        self._queue_starts: dict[str, bytes] = {}
        #: a payload's opening by (queue name, codec line): the AESGCM of its key, the queue's
        #: part of the associated data, whether compressed (``_open_fast``; a claim's tasks
        #: share a few lines)
        self._openers: dict[tuple[str, bytes], tuple[Any, bytes, bool]] = {}

    def _associated_data(self, queue: str, task_id: str, purpose: bytes) -> bytes:
        """``associated_data(queue, task_id, purpose)``, its queue's part made once."""
        queue_data = self._queue_starts.get(queue)
        if queue_data is None:
            queue_data = _queue_data(queue)
            if len(self._queue_starts) >= _LINES_KEPT:
                self._queue_starts.clear()
            self._queue_starts[queue] = queue_data
        return _task_data(queue_data, task_id, purpose)

    def __repr__(self) -> str:
        return f"PayloadCodec({self.codec!r}, compression={self.compression!r})"

    def seal(self, data: bytes, queue: str, task_id: str, purpose: bytes = b"") -> bytes:
        """The stored body of the JSON ``data`` of task ``task_id``: a codec line and its bytes
        (or ``data`` itself when neither compression nor encryption applies). ``purpose`` is
        empty for a payload, else what the value is (``result_purpose`` and the like)."""
        flag = b""
        if self.compression is not None and len(data) >= self.compress_from_bytes:
            codec = zstd()
            assert codec is not None  # checked in __init__
            packed = codec.compress(data)
            if len(packed) + 4 < len(data):  # the codec line costs 3 bytes or more
                data, flag = packed, ZSTD_FLAG
        if self.codec is None:
            return b"%" + flag + b"|\n" + data if flag else data
        line = b"%" + flag + self.codec.line_key + b"\n"
        return line + self.codec.seal(data, line, self._associated_data(queue, task_id, purpose))

    def open(
        self,
        body: bytes,
        queue: str,
        task_id: str | None,
        purpose: bytes = b"",
        start: int = 0,
    ) -> bytes:
        """The JSON bytes of a sealed body (``body[start:]``, which starts with SEAL_MARK: a
        claim passes the whole envelope and where its payload starts, so nothing is copied
        out before decrypting); UndecryptableTask when it is encrypted and cannot be opened,
        PayloadError when it is unreadable. ``purpose``: as ``seal``'s."""
        line_end = body.find(b"\n", start, start + 80) + 1
        if not purpose and task_id is not None and line_end > start:
            opened = self._open_fast(body, queue, task_id, start, line_end)
            if opened is not None:
                return opened
        line = body[start:line_end] if line_end > start else b""
        parsed = _LINES.get(line) or _codec_line(line)
        if parsed is None:
            raise PayloadError("stored payload's codec line is unreadable")
        compressed, key_id = parsed
        if key_id is None:
            data = body[line_end:]
        else:
            opened = None
            if self.codec is not None and task_id is not None:
                aad = self._associated_data(queue, task_id, purpose)
                opened = self.codec.open(key_id, body, line, aad, at=line_end)
                if opened is None and not purpose:
                    opened = self._open_occurrence(key_id, body, line, queue, task_id, line_end)
            if opened is None:
                self._refuse(key_id, task_id, purpose)
            data = opened
        return _decompressed(data) if compressed else data

    def _open_occurrence(
        self, key_id: str, body: bytes, line: bytes, queue: str, task_id: str, at: int
    ) -> bytes | None:
        """A cron occurrence's payload, sealed for its definition (``CRON_PURPOSE``), when
        ``task_id`` is an occurrence's; None otherwise. Tried after the task's own binding
        fails, so an ordinary task whose id looks like an occurrence's opens as its own."""
        found = _OCCURRENCE.fullmatch(task_id)
        if found is None or self.codec is None:
            return None
        aad = self._associated_data(queue, found[1], CRON_PURPOSE)
        return self.codec.open(key_id, body, line, aad, at=at)

    def _open_fast(
        self, body: bytes, queue: str, task_id: str, start: int, line_end: int
    ) -> bytes | None:
        """``open`` of a payload (no purpose) whose codec line this codec has opened before
        for ``queue``: its cipher and associated data found with one lookup, decrypted where
        it lies. None for anything else, a failed tag included (``open``'s general path then
        decides and reports it): the same checks, in fewer steps, as a claim opens thousands.
        """
        line = body[start:line_end]
        opener = self._openers.get((queue, line))
        if opener is None:
            return self._learn_opener(queue, line, body, task_id, start, line_end)
        cipher, queue_data, compressed = opener
        assert self.codec is not None  # an opener is kept only for a codec's key
        t = task_id.encode("utf-8")
        nonce_end = line_end + NONCE_BYTES
        if len(body) - nonce_end < TAG_BYTES:
            return None
        try:
            data: bytes = cipher.decrypt(
                body[line_end:nonce_end],
                body[nonce_end:],
                queue_data + _SHORT.pack(len(t)) + t + line,
            )
        except self.codec._invalid_tag:  # noqa: SLF001 - this module's class; tampered or moved
            return None
        return _decompressed(data) if compressed else data

    def _learn_opener(
        self, queue: str, line: bytes, body: bytes, task_id: str, start: int, line_end: int
    ) -> bytes | None:
        """Keep the opener of ``line`` for ``queue`` when it names a key this codec holds
        (``_open_fast``'s cache), then open ``body`` with it; None otherwise."""
        parsed = _codec_line(line)
        if self.codec is None or parsed is None or parsed[1] is None:
            return None
        cipher = self.codec._cipher(parsed[1])  # noqa: SLF001 - this module's class
        if cipher is None:
            return None
        if len(self._openers) >= _LINES_KEPT:
            self._openers.clear()
        self._openers[(queue, line)] = (cipher, _queue_data(queue), parsed[0])
        return self._open_fast(body, queue, task_id, start, line_end)

    def _refuse(self, key_id: str, task_id: str | None, purpose: bytes) -> NoReturn:
        """The UndecryptableTask of a value encrypted with ``key_id`` that did not open: no
        codec, no such key, or a tag that failed (``open``'s slow path: only refusals)."""
        tid = "" if task_id is None else task_id
        what = f"task {tid!r}" if not purpose else f"the {_what(purpose)} of task {tid!r}"
        if self.codec is None:
            raise UndecryptableTask(
                f"{what} is encrypted with key {key_id!r} and this queue has no "
                "codec (Queue(..., codec=dueq.Encrypted(...)); dueq worker: set DUEQ_KEYS)",
                tid,
                key_id,
            )
        why = (
            "its ciphertext failed authentication (tampered, or moved from another task)"
            if self.codec.knows(key_id)
            else f"no key {key_id!r} is known to this queue's codec"
        )
        raise UndecryptableTask(f"{what} cannot be decrypted: {why}", tid, key_id)

    def seal_value(self, text: str, queue: str, task_id: str, purpose: bytes) -> str:
        """The JSON text of a value other than the payload (a kept result, a step result, a
        progress body) as stored: with an encrypting codec, the JSON string SEALED_VALUE_MARK
        + the base64 of its sealed body (compressed first as payloads are); else ``text``
        itself (values are not compressed without encryption: base64 would eat the gain)."""
        if self.codec is None:
            return text
        body = self.seal(text.encode("utf-8"), queue, task_id, purpose)
        return SEALED_VALUE_JSON + base64.b64encode(body).decode("ascii") + '"'

    def open_value(self, value: Any, queue: str, task_id: str, purpose: bytes) -> Any:
        """A decoded JSON ``value`` as it was before ``seal_value``: a sealed one opened (as
        task ``task_id`` of ``queue``, for ``purpose``), any other as it is.
        UndecryptableTask when no known key opens it, PayloadError when it is unreadable."""
        body = sealed_body(value, _what(purpose))
        if body is None:
            return value
        data = self.open(body, queue, task_id, purpose)
        try:
            return json.loads(data)
        except ValueError:
            raise PayloadError(f"the stored {_what(purpose)} is not JSON") from None

    def shown_value(self, value: Any, queue: str, task_id: str, purpose: bytes) -> Any:
        """``open_value``, or for a value it cannot open, its SealedMarker (a snapshot shows
        what it can and never raises for one task's value)."""
        try:
            return self.open_value(value, queue, task_id, purpose)
        except PayloadError as exc:
            return SealedMarker(sealed_value_marker(value), exc)


def sealed_body(value: Any, what: str = "sealed value") -> bytes | None:
    """The sealed body of a value ``seal_value`` sealed, None for any other (a cron
    definition's occurrences carry the body of its sealed payload); PayloadError, naming
    ``what``, when it is unreadable."""
    if not (isinstance(value, str) and value.startswith(SEALED_VALUE_MARK)):
        return None
    try:
        return base64.b64decode(value[1:], validate=True)
    except (binascii.Error, ValueError):
        raise PayloadError(f"the stored {what} is unreadable") from None


def _decompressed(data: bytes) -> bytes:
    """The bytes of a zstd-compressed payload; PayloadError when no zstd is installed here."""
    codec = zstd()
    if codec is None:
        raise PayloadError(
            "stored payload is zstd-compressed and no zstd is installed here: "
            "pip install 'dueq[zstd]'"
        )
    return codec.decompress(data)


def sealed_error_record(codec: PayloadCodec, record: str, queue: str, task_id: str) -> str:
    """An error record (``failures.error_record``) with its message and traceback sealed when
    the codec says ``errors=True`` (the type and module stay readable), else ``record``."""
    if codec.codec is None or not codec.codec.errors:
        return record
    item = json.loads(record)
    for field, purpose in (("message", ERROR_PURPOSE), ("traceback", TRACEBACK_PURPOSE)):
        if isinstance(item.get(field), str):
            item[field] = json.loads(
                codec.seal_value(json.dumps(item[field]), queue, task_id, purpose)
            )
    return json.dumps(item)  # ASCII: the sealed values' mark is a lone surrogate


def sealed_value_marker(value: str) -> str:
    """The marker of a sealed value (``<encrypted k2, 412 B>``) without opening it."""
    try:
        info = sealed_info(base64.b64decode(value[1:], validate=True))
    except (binascii.Error, ValueError):
        info = None
    return "<unreadable sealed value>" if info is None else info.marker()


#: The first character of a sealed value (``PayloadCodec.seal_value``): a lone surrogate, which
#: no value of a handler or step can hold (its JSON is refused as no UTF-8 text:
#: ``envelope.result_entry``, ``envelope.json_text``), so a sealed value is never mistaken for
#: a plain one, while the scripts store and move it as any JSON string (none decodes it).
SEALED_VALUE_MARK = "\udc25"
#: How a sealed value's JSON text starts.
SEALED_VALUE_JSON = '"\\udc25'

#: The codec of a queue that has none: reads compressed payloads, refuses encrypted ones.
NO_CODEC = PayloadCodec()
