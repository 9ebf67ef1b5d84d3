"""Read 'key: value' from a flat repo.yaml without needing PyYAML."""


def value(path, key):
    for line in open(path):
        k, _, v = line.strip().partition(":")
        if k == key:
            return v.strip().strip("'\"")
    return None
