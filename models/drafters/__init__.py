"""Drafters for speculative decoding of a target model: DSpark, DFlash and Eagle3.

Terms, used verbatim across dspark:
- target features: the concatenated outputs of the target decoder layers `target_layer_ids` at one position
  (see dspark.models.target_features); the drafter's only view of the target besides its embedding and head.
- context: the target features of the positions the target has already processed and the user has committed.
- anchor: the last committed token, at position p; its target features do not exist yet. It is the first
  input of a block and the first Markov "previous token".
- draft tokens d_1..d_gamma: the proposal for positions p+1..p+gamma; gamma = config.block_size.
- accepted: the longest prefix of the draft the target's verification keeps; the bonus token is the target's
  own token right after it (a correction when a draft was rejected). Accepted drafts plus the bonus are
  committed; the bonus becomes the next anchor.
- confidence: sigma(c_k), the predicted probability that d_k is accepted given d_<k were.

Modules: config (DrafterConfig), base (the shared Drafter interface, DraftBlock, DraftState, TrainOutput),
dspark (DSpark, DFlash), eagle3 (Eagle3), markov_head, confidence_head, layers, sampling.
"""
from dspark.models.drafters.base import DraftBlock, Drafter, DraftState, TrainOutput
from dspark.models.drafters.config import DrafterConfig
from dspark.models.drafters.dspark import DFlash, DSpark
from dspark.models.drafters.eagle3 import Eagle3

DRAFTER_CLASSES = {"dspark": DSpark, "dflash": DFlash, "eagle3": Eagle3}  # DrafterConfig.kind -> class

__all__ = ["DFlash", "DSpark", "DraftBlock", "DraftState", "Drafter", "DrafterConfig", "Eagle3", "TrainOutput",
           "DRAFTER_CLASSES"]
