"""Values that the dialects bind in a way of their own (pure: no model imports).

The enqueue side builds rows with these, the dialects recognise them; living in ``db``
keeps the dependency pointing from the enqueue side down to the database layer.
"""

from __future__ import annotations


class JsonText(str):
    """JSON already encoded to text, bound as-is: the codec encodes once, and each dialect
    adds only what its database needs to read text as JSON (``Dialect.json_param``)."""

    __slots__ = ()
