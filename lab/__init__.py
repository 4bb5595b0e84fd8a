"""Local tooling: emulator control, the demo driver and the chaos harness. Not deployed."""
