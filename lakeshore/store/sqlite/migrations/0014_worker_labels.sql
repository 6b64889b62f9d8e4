-- A daemon is named by its label more often than by its id (`daemon exec
-- gpu-rig ...`): the control plane finds the workers of one label here
-- instead of reading the whole namespace.
CREATE INDEX workers_label ON workers (namespace, label, id);
