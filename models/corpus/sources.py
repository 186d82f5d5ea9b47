"""Where each corpus domain's text comes from, and how one file becomes text.

A domain is a set of real text files that ship with this machine (or with a
Debian package the builder may install). Every domain names the packages that
provide it, so a missing source fails with a message that says what to install.

Contract of a cleaner: ``clean(raw_bytes) -> str | None``; ``None`` rejects the
file (not text). Cleaners are pure functions of the file's bytes, so the corpus
is a pure function of the source tree.
"""

from __future__ import annotations

import gzip
import re
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

Cleaner = Callable[[bytes], "str | None"]


@dataclass(frozen=True)
class DomainSource:
    """One domain: a root folder, which files under it count, how to clean them."""

    name: str
    description: str
    root: Path
    suffixes: tuple[str, ...]  # a file counts if its name ends with one of these
    exclude_dirs: tuple[str, ...]  # path components that exclude a file
    cleaner: Cleaner
    apt_packages: tuple[str, ...]  # Debian packages that provide (more of) it
    exclude_prefixes: tuple[str, ...] = field(default=())  # relpaths starting so are skipped

    def list_files(self) -> list[Path]:
        """Every candidate file under ``root``, sorted by relative path (determinism)."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.rglob("*"):
            rel = path.relative_to(self.root)
            if not path.is_file() or path.is_symlink():
                continue
            if not path.name.endswith(self.suffixes):
                continue
            if any(part in self.exclude_dirs for part in rel.parts[:-1]):
                continue
            if rel.as_posix().startswith(self.exclude_prefixes):
                continue
            found.append(path)
        return sorted(found, key=lambda p: p.relative_to(self.root).as_posix())


def _decode_text(raw: bytes) -> str | None:
    """UTF-8 text with LF line ends, or None for binary / non-UTF-8 files."""
    if b"\x00" in raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def clean_plain(raw: bytes) -> str | None:
    """Source code and reStructuredText: kept verbatim (normalised line ends)."""
    text = _decode_text(raw)
    if text is None:
        return None
    return text.rstrip() + "\n"


# roff escapes that only change fonts or spacing: \fB \fI \fR \fP \f(CW \f[...] \, \/ \& \: \%
_ROFF_FONT = re.compile(r"\\f(\(..|\[[^\]]*\]|.)")
_ROFF_SPACING = re.compile(r"\\[,/&:%|^]")
_ROFF_NAMED = (
    (r"\-", "-"), (r"\(em", "—"), (r"\(en", "–"), (r"\(bu", "•"), (r"\(aq", "'"), (r"\(dq", '"'),
    (r"\(lq", "“"), (r"\(rq", "”"), (r"\(Fo", "«"), (r"\(Fc", "»"), (r"\(co", "©"), (r"\e", "\\"),
    (r"\ ", " "), (r"\~", " "), (r"\(ga", "`"), (r"\(ha", "^"), (r"\(ti", "~"), (r"\(rs", "\\"),
)
# macros whose arguments are running text (headings, font macros)
_ROFF_TEXT_MACROS = frozenset({"SH", "SS", "B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB", "UR", "MT"})


def roff_to_text(source: str) -> str:
    """Man page source (roff) to readable text: drops comments and layout
    macros, keeps the words of headings and font macros, resolves common escapes."""
    lines = []
    for line in source.split("\n"):
        if line.startswith(('.\\"', "'\\\"", ".\\#")):
            continue  # comment (often English licence boilerplate)
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            if not parts or parts[0] not in _ROFF_TEXT_MACROS or len(parts) == 1:
                if parts and parts[0] in ("SH", "SS", "PP", "P", "LP"):
                    lines.append("")  # paragraph break
                continue
            words = parts[1].replace('"', "")
            line = words.upper() if parts[0] == "SH" else words
        for escape, char in _ROFF_NAMED:
            line = line.replace(escape, char)
        line = _ROFF_FONT.sub("", line)
        line = _ROFF_SPACING.sub("", line)
        lines.append(line)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines))
    return text.strip() + "\n"


def clean_manpage(raw: bytes) -> str | None:
    """A gzip-compressed man page (German translation) as readable text."""
    try:
        raw = gzip.decompress(raw)
    except (OSError, EOFError):
        return None
    text = _decode_text(raw)
    if text is None:
        return None
    return roff_to_text(text)


def default_sources() -> list[DomainSource]:
    """The project's four domains, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [
        DomainSource(
            name="python",
            description="Python source code: the standard library of the running interpreter",
            root=stdlib,
            suffixes=(".py",),
            exclude_dirs=("site-packages", "__pycache__", "dist-packages"),
            cleaner=clean_plain,
            apt_packages=(),
        ),
        DomainSource(
            name="english",
            description="English prose: reStructuredText sources of the Python 3.11 documentation",
            root=Path("/usr/share/doc/python3.11/html/_sources"),
            suffixes=(".rst.txt",),
            exclude_dirs=(),
            cleaner=clean_plain,
            apt_packages=("python3.11-doc",),
        ),
        DomainSource(
            name="c",
            description="C source: header files under /usr/include (C++ trees excluded)",
            root=Path("/usr/include"),
            suffixes=(".h",),
            exclude_dirs=("c++",),
            cleaner=clean_plain,
            apt_packages=("linux-libc-dev", "libssl-dev", "libc6-dev"),
        ),
        DomainSource(
            name="german",
            description="German prose: Debian's German translations of the manual pages (roff stripped)",
            root=Path("/usr/share/man/de"),
            suffixes=(".gz",),
            exclude_dirs=(),
            cleaner=clean_manpage,
            apt_packages=("manpages-de", "manpages-de-dev"),
        ),
    ]
