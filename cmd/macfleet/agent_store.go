package main

import (
	"context"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// newStore opens the agent's model store as `macfleet agent` runs it: the flags'
// options, downloads checked by policy (every connection and every redirect). The
// attack tests build their store with it, so that what they prove is what ships.
// hubTokens, when not nil, gives the hub token where neither --hf-token nor $HF_TOKEN
// does (the fleet's Secret).
func (fl agentFlags) newStore(policy *sourcepolicy.Holder, hubTokens func(context.Context) string, log logr.Logger) (*store.Store, error) {
	opts, err := fl.storeOptions()
	if err != nil {
		return nil, err
	}
	opts.Log, opts.Policy, opts.HFTokenSource = log, policy, hubTokens
	return store.New(fl.opts.StoreDir, opts)
}
