"""Pictures: colour maps and overlays, image encoding, matplotlib panels, the HTML gallery."""
