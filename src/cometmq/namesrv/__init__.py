"""The nameserver: the route registry brokers register with and clients ask for topic routes."""
