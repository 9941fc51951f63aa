from _typeshed import Incomplete

__version__: str

def __getattr__(name: str) -> Incomplete: ...
