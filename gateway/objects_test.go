package gateway

import "github.com/macfleet/macfleet/test/support/fleetobjects"

// Builders of the API objects the table is computed from.
var (
	deployment   = fleetobjects.Deployment
	node         = fleetobjects.MacNode
	replica      = fleetobjects.Replica
	withParallel = fleetobjects.WithParallel
)
