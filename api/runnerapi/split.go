package runnerapi

// The first frame of a split worker's peer link, as the worker protocol defines it
// (metal/runner/netdevice/wire.h, MFND_PEER_HELLO): a 4-byte little-endian payload length,
// the command byte SplitPeerHello and the next worker's session id
// (SplitPeerSessionBytes). The worker Mac's agent reads it before it pipes a peer link
// to its worker: the Mac of the previous worker shard may greet the worker as its
// peer, and open no runner's session with it.
const (
	SplitPeerHello        = 14
	SplitPeerSessionBytes = 16
)
