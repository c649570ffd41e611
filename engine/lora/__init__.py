"""Multi-LoRA inside the engine.

``ref`` names an adapter by content hash; ``manager`` keeps adapters in host memory and device slots and
loads them off the engine thread; ``slot_table`` says which adapter holds which device slot and
``slot_weights`` holds the slots' weights in the kernels' layout; ``context`` adds every scheduled token's
adapter delta during a step; ``admission`` lets the scheduler run at most ``max_loras`` adapters at once.
"""

from loraplex.engine.lora.ref import AdapterRef

__all__ = ["AdapterRef"]
