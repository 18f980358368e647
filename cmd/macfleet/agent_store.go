package main

import (
	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// newStore opens the agent's model store as `macfleet agent` runs it: the flags'
// options, downloads checked by policy (every connection and every redirect). The
// attack tests build their store with it, so that what they prove is what ships.
func (fl agentFlags) newStore(policy *sourcepolicy.Holder, log logr.Logger) (*store.Store, error) {
	opts, err := fl.storeOptions()
	if err != nil {
		return nil, err
	}
	opts.Log, opts.Policy = log, policy
	return store.New(fl.opts.StoreDir, opts)
}
