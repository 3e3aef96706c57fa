"""Pure hashing and membership views: the weighted virtual-node ring. No I/O, no clock, no randomness."""
