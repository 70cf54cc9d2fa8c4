"""A served HTML page as the tests read it: its tables, elements by id, and
what a strict Content-Security-Policy would refuse to run.

Parsed with the standard library's ``html.parser``; no browser, no script runs.
"""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}  # fmt: skip


def squeeze(text: str) -> str:
    return " ".join(text.split())


class ServedPage(HTMLParser):
    """``tables``: table id -> body rows, each ``{"attrs", "cells"}``; a cell is
    ``{"attrs", "text", "links"}``, a link ``{"attrs", "text"}`` (texts with
    whitespace squeezed). ``by_id``: element id -> its node (``text``, and
    ``links``: the links inside it). ``inline``: every
    script body, ``<style>``, ``style=``, ``on*=`` handler and ``javascript:``
    URL (what ``script-src 'self'; style-src 'self'`` refuses). ``scripts``:
    (src, defer) of external scripts; ``stylesheets``: their hrefs."""

    def __init__(self, html: str | bytes) -> None:
        super().__init__()
        self.stack: list[dict[str, Any]] = []
        self.tables: dict[str, list[dict[str, Any]]] = {}
        self.by_id: dict[str, dict[str, Any]] = {}
        self.inline: list[str] = []
        self.scripts: list[tuple[str, bool]] = []
        self.stylesheets: list[str] = []
        self.feed(html.decode() if isinstance(html, bytes) else html)
        self.close()
        for node in self.by_id.values():
            node["text"] = squeeze(node["text"])

    def text(self, element_id: str) -> str:
        return self.by_id[element_id]["text"]

    def rows(self, table_id: str) -> list[dict[str, Any]]:
        return self.tables[table_id]

    # -- parsing -------------------------------------------------------------------

    def _nearest(self, tag: str) -> dict[str, Any] | None:
        return next((node for node in reversed(self.stack) if node["tag"] == tag), None)

    def _check_inline(self, tag: str, attrs: dict[str, str]) -> None:
        if tag == "script" and not attrs.get("src"):
            self.inline.append("<script> with a body")
        if tag == "script" and attrs.get("src"):
            self.scripts.append((attrs["src"], "defer" in attrs))
        if tag == "style":
            self.inline.append("<style>")
        if tag == "link" and attrs.get("rel") == "stylesheet":
            self.stylesheets.append(attrs.get("href", ""))
        for name, value in attrs.items():
            if name == "style" or name.startswith("on"):
                self.inline.append(f"{name}= on <{tag}>")
            if value.strip().lower().startswith("javascript:"):
                self.inline.append(f"javascript: URL in {name}= on <{tag}>")

    def handle_starttag(self, tag: str, attr_list: list[tuple[str, str | None]]) -> None:
        attrs = {name: value or "" for name, value in attr_list}
        self._check_inline(tag, attrs)
        if tag in VOID:
            return
        node: dict[str, Any] = {"tag": tag, "attrs": attrs, "text": "", "cells": [], "links": []}
        if "id" in attrs:
            self.by_id[attrs["id"]] = node
        table = self._nearest("table")
        if tag == "table":
            self.tables[attrs.get("id", "")] = []
        elif tag == "tr" and table is not None and self._nearest("tbody") is not None:
            self.tables[table["attrs"].get("id", "")].append(node)
        elif tag == "td" and (row := self._nearest("tr")) is not None:
            row["cells"].append(node)
        if tag == "a":
            for ancestor in self.stack:
                ancestor["links"].append(node)
        self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID or self._nearest(tag) is None:
            return
        while self.stack:
            node = self.stack.pop()
            node["text"] = squeeze(node["text"])
            if node["tag"] == tag:
                break

    def handle_data(self, data: str) -> None:
        for node in self.stack:
            node["text"] += data
