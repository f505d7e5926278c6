-- Argo CD health check for inferentia.dev/InferentiaModel.
-- Healthy: Ready=True for the current generation. Degraded: the spec is invalid, the
-- compile failed or the rollout passed its progress deadline (someone must act).
-- Progressing: everything else, including waiting for Neuron capacity, which a cluster
-- autoscaler may still bring.
local hs = {status = "Progressing", message = "Waiting for the operator to report status"}
if obj.status == nil then
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then
      hs.message = condition.message or ""
      if condition.status == "True" then
        hs.status = "Healthy"
      elseif condition.reason == "InvalidSpec" or condition.reason == "CompileFailed" or condition.reason == "ProgressDeadlineExceeded" then
        hs.status = "Degraded"
      end
      return hs
    end
  end
end
return hs
