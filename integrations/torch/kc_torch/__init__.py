"""kc-torch: kc as a torch.compile backend. `torch.compile(model, backend="kc")` after `pip install kc-torch`;
`kc_torch.fallbacks()` lists what ran in torch instead, and why."""
from kc_torch.backend import kc_backend
from kc_torch.options import Options
from kc_torch.region import program_count as region_programs
from kc_torch.report import Fallback, fallbacks, clear as clear_fallbacks

__all__ = ["kc_backend", "Options", "Fallback", "fallbacks", "clear_fallbacks", "region_programs"]
