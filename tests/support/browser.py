"""The DevTools client the browser tests drive Chromium with: the one the benchmark uses too."""

from chromium_devtools import INSTALL_HINT, Browser, BrowserError, Page, chromium_path

__all__ = ["INSTALL_HINT", "Browser", "BrowserError", "Page", "chromium_path"]
