"""Training math and state: token alignment masks, advantages, microbatched forwards,
gradient accumulation, the losses, the joint PPO step, train states, memory plans and the
full resume checkpoint.

Submodules (imported explicitly): alignment, advantages, forward, grad_accum, losses,
ppo_step, train_state, memory_plan, checkpoint. Pure functions of arrays and train states:
no sandbox, harness or stage code.
"""
