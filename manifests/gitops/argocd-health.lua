-- Argo CD health check for inferentia.dev/InferentiaModel.
-- Healthy: Ready=True for the current generation. Degraded: Stalled=True, the operator's
-- word that retrying cannot help and someone must act (an invalid spec, a failed compile, a
-- child it cannot create or does not own, a rollout past its deadline): the same condition
-- Flux's kstatus reads, so both agree. Progressing: everything else, including waiting for
-- Neuron capacity, which a cluster autoscaler may still bring.
local hs = {status = "Progressing", message = "Waiting for the operator to report status"}
if obj.status == nil then
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
if obj.status.conditions ~= nil then
  local ready = nil
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Stalled" and condition.status == "True" then
      hs.status = "Degraded"
      hs.message = condition.message or ""
      return hs
    end
    if condition.type == "Ready" then
      ready = condition
    end
  end
  if ready ~= nil then
    hs.message = ready.message or ""
    if ready.status == "True" then
      hs.status = "Healthy"
    end
  end
end
return hs
