package gateway

import (
	"encoding/json"
	"net/http"
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
func (t *Table) modelID(rt *Route) string {
	if rs := t.bare[rt.ServedName]; len(rs) == 1 {
		return rt.ServedName
	}
	return rt.Namespace + "/" + rt.ServedName
}

func (t *Table) modelObject(rt *Route) modelObject {
	return modelObject{ID: t.modelID(rt), Object: "model", Created: rt.Created.Unix(), OwnedBy: rt.Namespace,
		Namespace: rt.Namespace, Deployment: rt.Deployment, Aliases: rt.Aliases, ReadyReplicas: len(rt.Backends)}
}

// handleListModels lists one model per ModelDeployment, sorted by namespace and name.
func (g *Gateway) handleListModels(w http.ResponseWriter, _ *http.Request) {
	t := g.Table()
	data := make([]modelObject, 0, len(t.routes))
	for _, rt := range t.routes {
		data = append(data, t.modelObject(rt))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// handleGetModel answers GET /v1/models/{id} for any name a request may use.
func (g *Gateway) handleGetModel(w http.ResponseWriter, r *http.Request) {
	t := g.Table()
	rt, aerr := t.Resolve(r.PathValue("id"))
	if aerr != nil {
		aerr.write(w)
		return
	}
	writeJSON(w, http.StatusOK, t.modelObject(rt))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		(&apiError{Status: http.StatusInternalServerError, Type: typeServer, Code: "internal_error",
			Message: "encoding the response: " + err.Error()}).write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
