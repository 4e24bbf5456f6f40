"""slca-exp: declarative, recorded experiments for segment-level credit assignment (SLCA-GRPO)."""

__version__ = "0.1.0"
