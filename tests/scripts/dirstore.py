"""A key-value store over files in one directory (set/get/check, as StoreBootstrap needs), for tests that
start ranks as plain processes: no launcher tears the survivors down when a rank dies."""
import os


class DirStore:
    """set/get/check over files in one directory (written whole, then renamed into place)."""

    def __init__(self, path):
        self.path = path

    def _file(self, key):
        return os.path.join(self.path, key.replace("/", "_"))

    def set(self, key, value):
        with open(self._file(key) + ".tmp", "wb") as f:
            f.write(value)
        os.replace(self._file(key) + ".tmp", self._file(key))

    def get(self, key):
        with open(self._file(key), "rb") as f:
            return f.read()

    def check(self, keys):
        return all(os.path.exists(self._file(k)) for k in keys)
