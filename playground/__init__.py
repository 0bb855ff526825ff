"""GET /playground: a page that shows a diffusion model's canvas denoise, step by step, live (see routes.py)."""

from playground.routes import playground_router

__all__ = ["playground_router"]
