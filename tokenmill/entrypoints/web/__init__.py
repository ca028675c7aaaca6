"""The web chat page at `/` (static HTML, JS and CSS in static/, served by router.py)."""
