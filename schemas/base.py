"""The base of the on-disk JSON models (manifest, plan summary): strict, and able to grow.

Fields are forbidden unless declared (``extra="forbid"``: a typo in a file is an error, not a
silently ignored key). A field added after the first files were written is listed in the model's
``_omit_default``: it is left out of the JSON while it holds its default, so a file that uses
none of the new fields keeps its bytes, and older files, which lack them, load with the defaults.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class FileModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: fields written only when they differ from their default
    _omit_default: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        d = handler(self)
        if isinstance(d, dict):
            for k in self._omit_default:
                default = type(self).model_fields[k].get_default(call_default_factory=True)
                if k in d and d[k] == default:
                    del d[k]
        return d
