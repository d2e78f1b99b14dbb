"""Connecting: opening SSH hops (hop.py); deploy/transport.py runs commands over them."""
