package gateway

import (
	"context"
	"errors"
	"sync"
)

// errMacLost is why the gateway cut a stream whose Mac was lost.
var errMacLost = errors.New("the replica's Mac was lost (its MacNode is no longer Ready)")

// watchMac cuts a stream's upstream request (cut) once the routing table knows its Mac
// node to be lost (Table.MacLost: its lease expired), so that a stream whose agent
// stopped answering without closing the connection — a process stopped or frozen, a
// Mac asleep or cut off without a reset — breaks there and is continued on another
// replica instead of hanging. A stream whose replica drains, or leaves the table on a
// Ready Mac, is not cut. stop ends the watch; it may be called more than once.
func (g *Gateway) watchMac(node string, cut context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	go func() {
		for {
			tbl := g.Table()
			if tbl.MacLost(node) {
				g.log.Info("Cutting a stream whose Mac was lost", "node", node)
				cut(errMacLost)
				return
			}
			select {
			case <-tbl.Changed():
			case <-done:
				return
			}
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}
