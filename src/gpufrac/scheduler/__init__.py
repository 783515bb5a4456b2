"""`gpufrac scheduler`: a secondary Kubernetes scheduler for GPU shares.

How a pod flows through it: the reflectors (`kubeapi.reflector`) feed nodes and pods into the cache
(`cache`, keyed by pod UID) and pending pods into the queue (`queue`); the loop (`loop`) pops a pod, filters
the nodes it may use (`eligibility`), asks the engine (`gpufrac.placement`) on the cache's snapshot, assumes
the placement, and binds (`objects.bind_plan`, then `binder`). `leader` elects one binding replica, `serve`
runs it all as a process, `metrics` exports it, and `top` shows the cache to people.
"""
