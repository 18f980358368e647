package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// modelObject is one entry of GET /v1/models: the OpenAI fields plus the deployment's
// namespace, aliases and routable replica count.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Extensions (ignored by OpenAI clients).
	Namespace     string   `json:"namespace"`
	Deployment    string   `json:"deployment"`
	Aliases       []string `json:"aliases,omitempty"`
	ReadyReplicas int      `json:"ready_replicas"`
}

// modelID is the name a client should send for rt: its served name when that names
// only rt in the fleet, else "<namespace>/<servedName>". Aliases are not listed as
// entries of their own (one entry per deployment, like the deployments themselves);
// they appear in the entry's "aliases".
func (t *Table) modelID(rt *Route, id tenancy.Identity) string {
	if rs := visible(t.bare[rt.ServedName], id); len(rs) == 1 {
		return rt.ServedName
	}
	return rt.Namespace + "/" + rt.ServedName
}

func (t *Table) modelObject(rt *Route, id tenancy.Identity) modelObject {
	return modelObject{ID: t.modelID(rt, id), Object: "model", Created: rt.Created.Unix(), OwnedBy: rt.Namespace,
		Namespace: rt.Namespace, Deployment: rt.Deployment, Aliases: rt.Aliases, ReadyReplicas: len(rt.Backends)}
}

// handleListModels lists one model per ModelDeployment the caller may use, sorted by
// namespace and name.
func (g *Gateway) handleListModels(w http.ResponseWriter, r *http.Request) {
	t := g.Table()
	id := g.caller(r)
	data := make([]modelObject, 0, len(t.routes))
	for _, rt := range visible(t.routes, id) {
		data = append(data, t.modelObject(rt, id))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// handleGetModel answers GET /v1/models/{id} for any name a request may use.
func (g *Gateway) handleGetModel(w http.ResponseWriter, r *http.Request) {
	t := g.Table()
	id := g.caller(r)
	rt, aerr := t.ResolveAs(r.PathValue("id"), id)
	if aerr != nil {
		aerr.write(w)
		return
	}
	writeJSON(w, http.StatusOK, t.modelObject(rt, id))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		(&apiError{Status: http.StatusInternalServerError, Type: openaierr.TypeServer, Code: "internal_error",
			Message: "encoding the response: " + err.Error()}).write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
