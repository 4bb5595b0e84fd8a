"""The testing face (the ``testing`` extra: pytest): ``StoreContract``, the contract suite
every store — the shipped ones, and yours — passes against its real server, and the
read-back helpers tests and checkers use: ``entities`` (the stored business entities) and
``marker_keys`` (the stored markers' keys). Never used on the message path."""

from ._contract import StoreContract
from ._read_back import entities, marker_keys

__all__ = ["StoreContract", "entities", "marker_keys"]
