"""The broker: request processors and services built on the store, the timer and the transport."""
